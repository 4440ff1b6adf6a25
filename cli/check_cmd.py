"""`mpt check DIR`: does a committed plan still meet its target? The gate a CI pipeline runs.

The decisions are `tuner.jobs.check_run.check_plan`'s; this module parses the options
and renders the outcome as a verdict line, JSON, or a JUnit XML report.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from . import exitcodes
from .common import exit_code, guarded, message
from .options import CHECK, command_options, options
from .render import console, warn

EPILOG = """\b
Examples:
  mpt check mpt-out                                  # the folder `mpt tune --out` wrote
  mpt check runs/bf16 --model model.py --junit reports/mpt.xml
  mpt check --config configs/digits_sensor.yaml --json
  mpt check mpt-out --checkpoint     # evaluate the stored model.safetensors instead

\b
The model file is taken from --model, else `model:` in --config, else the
`model:` entry `mpt tune` records in plan.yaml (relative to DIR).
Exit codes: 0 the plan meets its target, 3 it no longer does, 2 bad usage or a
plan/checkpoint that does not fit the model, 4 the model file failed.
"""


def _print_json(data: dict[str, Any]) -> None:
    json.dump(data, sys.stdout, indent=1)
    sys.stdout.write("\n")


@click.command(CHECK, epilog=EPILOG)
@options(CHECK)
@guarded
def check_cmd(**values: Any) -> None:
    """Check that a committed plan still meets its target (exit 0) or not (exit 3).

    Re-evaluates the FP32 baseline and the model under the plan in DIR (the
    folder `mpt tune --out` wrote), and compares with the target the plan's
    tolerance gives against the new baseline; a miss within the metric's
    noise still passes. Run it in CI after a model or data change: it fails
    when the change broke the plan.
    """
    from tuner.core.errors import MptError
    from tuner.jobs.check_run import check_plan, junit_xml, write_junit

    opts = command_options(values)  # tuner.options.commands.CheckOptions
    out_dir, as_json, junit_path = opts.out, opts.json, opts.junit
    t0 = time.monotonic()
    try:
        result = check_plan(opts)
    except MptError as exc:
        text = message(exc, click.get_current_context().command)
        if junit_path:
            write_junit(junit_path, junit_xml(f"plan {out_dir}", seconds=time.monotonic() - t0, error=text,
                                              error_type=type(exc).__name__))
        if as_json:
            _print_json({"status": "error", "exit_code": exit_code(exc), "error": text, "plan": out_dir})
        raise
    verdict = result.verdict()
    advice = f"the plan in {out_dir} no longer meets its target: re-run `mpt tune` and commit the new plan"
    if junit_path:
        write_junit(junit_path, junit_xml(f"{Path(result.model).name} {result.dtype} plan {out_dir}",
                                          seconds=result.seconds, failure=None if result.passed else verdict,
                                          details=verdict if result.passed else f"{verdict}\n{advice}",
                                          output=verdict))
    code = exitcodes.OK if result.passed else exitcodes.TARGET_NOT_MET
    if as_json:
        _print_json({**result.to_dict(), "exit_code": code})
    else:
        for w in result.warnings:
            warn(w)
        out = console()
        out.print(verdict, markup=False)
        if not result.passed:
            out.print(advice, markup=False)
    if code != exitcodes.OK:
        click.get_current_context().exit(code)

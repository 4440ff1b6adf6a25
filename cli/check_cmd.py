"""`mpt check DIR`: does a committed plan still meet its target? The gate a CI pipeline runs.

Re-evaluates the FP32 baseline of the model as it is now, applies the plan
(as `tuner.load` would), and compares the metric with the target computed
from the plan's own tolerance against the new baseline. `check_plan` does
the work without click; the command prints a verdict line (or JSON) and can
write a JUnit XML report.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click

from . import exitcodes
from .common import config_option, guarded, read_plan_header, user_code_options
from .render import console, warn

EPILOG = """\b
Examples:
  mpt check mpt-out                                  # the folder `mpt tune --out` wrote
  mpt check runs/bf16 --model-file model.py --junit reports/mpt.xml
  mpt check --config configs/digits_sensor.yaml --json
  mpt check mpt-out --checkpoint     # evaluate the stored model.safetensors instead

\b
The model file is taken from --model-file, else `model:` in --config, else the
`# model:` line `mpt tune` writes at the top of plan.yaml (relative to DIR).
Exit codes: 0 the plan meets its target, 3 it no longer does, 2 bad usage or a
plan/checkpoint that does not fit the model, 4 the model file failed.
"""

# Config keys whose parameter has another name here (tuner.config.KEYS lists the keys).
CONFIG_PARAMS = {"model": "model_file", "out": "plan_dir", "json": "as_json", "junit": "junit_path",
                 "eval": "eval_fn", "inputs": "inputs_fn"}


@dataclass
class CheckResult:
    """The outcome of re-evaluating a plan; `passed` says whether it still meets its target."""

    passed: bool
    metric: float
    baseline: float
    target: float
    tolerance: float
    absolute: bool
    lower_is_better: bool
    plan: str
    model: str
    dtype: str
    preset: str
    weights: str  # "fresh" (the model as built now) or "checkpoint" (DIR/model.safetensors)
    tuned_baseline: float | None = None
    tuned_metric: float | None = None
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)

    def verdict(self) -> str:
        """One line: `check: PASS 0.9852 >= target 0.9753 (baseline 0.9852, tolerance 1%)`."""
        digits = 4
        while digits < 12 and f"{self.metric:.{digits}g}" == f"{self.target:.{digits}g}" and \
                self.metric != self.target:
            digits += 2
        m, t, b = (f"{v:.{digits}g}" for v in (self.metric, self.target, self.baseline))
        if self.lower_is_better:
            op = "<=" if self.passed else ">"
        else:
            op = ">=" if self.passed else "<"
        if not math.isfinite(self.metric):
            op = "vs"
        tol = f"{self.tolerance:g} absolute" if self.absolute else f"{self.tolerance * 100:.4g}%"
        word = "PASS" if self.passed else "FAIL"
        return f"check: {word} {m} {op} target {t} (baseline {b}, tolerance {tol})"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = "pass" if self.passed else "fail"
        data["exit_code"] = exitcodes.OK if self.passed else exitcodes.TARGET_NOT_MET
        data["verdict"] = self.verdict()
        for k in ("metric", "baseline", "target", "tuned_baseline", "tuned_metric"):
            v = data[k]
            if isinstance(v, float) and not math.isfinite(v):
                data[k] = str(v)  # JSON has no NaN/inf
        return data


def _resolve_header_spec(text: str, plan_dir: Path) -> str:
    """A `file.py[:name]` from plan.yaml's header: relative to the plan's folder, else to the working dir."""
    head, sep, tail = text.rpartition(":")
    file_text, name = (head, tail) if sep and head and tail.isidentifier() else (text, "")
    if not file_text.lower().endswith(".py"):
        return text  # a bare function name
    path = Path(file_text).expanduser()
    if not path.is_absolute() and (plan_dir / path).exists():
        path = plan_dir / path
    elif not path.exists():
        from tuner.errors import ConfigError

        raise ConfigError(f"{plan_dir / 'plan.yaml'} was written for {file_text}, which is not there "
                          f"(looked relative to {plan_dir} and to the working directory); "
                          "pass --model-file MODEL.py or set `model:` in --config")
    return str(path) + (f":{name}" if name else "")


def _plan_file(plan_dir: str) -> tuple[Path, Path]:
    from tuner.errors import ConfigError

    path = Path(plan_dir)
    if path.is_file() and path.suffix in (".yaml", ".yml"):
        return path.parent, path
    if not path.exists():
        raise ConfigError(f"plan folder not found: {plan_dir} (the --out folder of `mpt tune`)")
    if not path.is_dir():
        raise ConfigError(f"{plan_dir} is not a folder or a plan .yaml file")
    plan_file = path / "plan.yaml"
    if not plan_file.is_file():
        raise ConfigError(f"no plan.yaml in {plan_dir}; run `mpt tune ... --out {plan_dir}` first")
    return path, plan_file


def _check_modules(model: Any, plan: Any) -> None:
    """The plan's module paths must exist in the model (globs excepted)."""
    from tuner.errors import PlanMismatchError

    names = {name for name, _ in model.named_modules()}
    missing = sorted({i.module for i in plan.fp32_instances if i.module not in names and i.module != "-"})
    missing += sorted({p for p, _ in plan.modules if not any(c in p for c in "*?[") and p not in names})
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise PlanMismatchError(f"the plan does not match this model: it names modules the model lacks: {shown} "
                                "(was the model changed? re-run mpt tune)")


def _unused_instances(model: Any, plan: Any, inputs: tuple) -> list[str]:
    """Plan instances the model no longer calls on example_inputs (a sign the plan is stale)."""
    import torch

    from tuner.engine import PrecisionEngine

    seen: set[tuple[str, str, int]] = set()

    def record(d: Any, *rest: Any) -> None:
        seen.add((d.module, d.op, d.index))

    with torch.no_grad(), PrecisionEngine(plan.policy(), plan.torch_dtype, root=model, recorder=record):
        model(*inputs)
    return [i.label() for i in plan.fp32_instances if i.key() not in seen]


def check_plan(plan_dir: str, model_file: str | None = None, *, model_fn: str | None = None,
               eval_fn: str | None = None, inputs_fn: str | None = None, device: str = "cpu",
               checkpoint: bool = False, tolerance: float | None = None) -> CheckResult:
    """Re-evaluate the plan in `plan_dir` (a `mpt tune` output folder, or a plan.yaml) on the model as it is now.

    Raises ConfigError (bad folder/plan/options), PlanMismatchError (the plan
    or checkpoint does not fit the model), DeviceError or UserCodeError.
    """
    from tuner.api import attach
    from tuner.devices import check_device
    from tuner.errors import ConfigError, UserCodeError
    from tuner.loader import load_user_model
    from tuner.plan import Plan
    from tuner.tune import TuneOptions

    t0 = time.monotonic()
    folder, plan_file = _plan_file(plan_dir)
    plan = Plan.load(plan_file)
    header = read_plan_header(plan_file)
    if model_file is None:
        if "model" not in header:
            raise ConfigError(f"{plan_file} does not say which model it was tuned for; "
                              "pass --model-file MODEL.py or set `model:` in --config")
        model_file = _resolve_header_spec(header["model"], folder)
    for key, given in (("build", model_fn), ("eval", eval_fn), ("inputs", inputs_fn)):
        if given is None and key in header:
            resolved = _resolve_header_spec(header[key], folder)
            model_fn, eval_fn, inputs_fn = ((resolved if key == "build" else model_fn),
                                            (resolved if key == "eval" else eval_fn),
                                            (resolved if key == "inputs" else inputs_fn))
    metrics = dict(plan.metrics or {})
    if tolerance is None:
        tolerance = metrics.get("tolerance")
        if tolerance is None:
            raise ConfigError(f"{plan_file} records no tolerance (metrics.tolerance); pass --tolerance")
    options = TuneOptions(dtype=plan.dtype, preset=plan.preset, tolerance=tolerance,
                          absolute=bool(metrics.get("absolute", False)),
                          lower_is_better=bool(metrics.get("lower_is_better", False)), device=device)
    check_device(device, plan.dtype)

    user = load_user_model(model_file, model=model_fn, eval=eval_fn, inputs=inputs_fn)
    fp32_model = user.build().to(device).eval()
    baseline = user.evaluate(fp32_model)
    if not math.isfinite(baseline):
        raise UserCodeError(f"evaluate returned {baseline} for the FP32 model; the baseline must be finite")
    del fp32_model
    target = options.target(baseline)

    model = user.build().to(device).eval()
    _check_modules(model, plan)
    warnings: list[str] = []
    inputs = user.example_inputs() if user.inputs_fn is not None else None
    if inputs is not None:
        inputs = tuple(a.to(device) if hasattr(a, "to") and hasattr(a, "dtype") else a for a in inputs)
        unused = _unused_instances(model, plan, inputs)
        if unused:
            warnings.append(f"the model no longer calls {len(unused)} of the plan's FP32 op instance(s) on "
                            f"example_inputs ({', '.join(unused[:3])}{' ...' if len(unused) > 3 else ''}); "
                            "the plan may be stale")
    if checkpoint:
        from tuner.checkpoint import load

        if plan_file.name != "plan.yaml":
            raise ConfigError("--checkpoint needs the tune output folder (with plan.yaml and model.safetensors)")
        load(model, folder)
    else:
        attach(model, plan)
    metric = user.evaluate(model)
    passed = options.meets(metric, target)
    tuned = metrics.get("tuned")
    return CheckResult(
        passed=passed, metric=metric, baseline=baseline, target=target, tolerance=float(tolerance),
        absolute=options.absolute, lower_is_better=options.lower_is_better, plan=str(plan_file),
        model=str(user.path), dtype=plan.dtype, preset=plan.preset,
        weights="checkpoint" if checkpoint else "fresh",
        tuned_baseline=float(metrics["baseline"]) if isinstance(metrics.get("baseline"), (int, float)) else None,
        tuned_metric=float(tuned) if isinstance(tuned, (int, float)) else None,
        seconds=time.monotonic() - t0, warnings=warnings)


def junit_xml(name: str, *, seconds: float, failure: str | None = None, error: str | None = None,
              error_type: str = "Error", details: str = "", output: str = "") -> str:
    """A JUnit XML document with one testsuite holding one testcase (a <failure> or <error> when not passing)."""
    import xml.etree.ElementTree as ET

    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    counts = {"tests": "1", "failures": "1" if failure else "0", "errors": "1" if error else "0",
              "skipped": "0", "time": f"{seconds:.3f}"}
    root = ET.Element("testsuites", {"name": "mpt check", **{k: v for k, v in counts.items() if k != "skipped"}})
    suite = ET.SubElement(root, "testsuite", {"name": "mpt check", **counts, "timestamp": stamp})
    case = ET.SubElement(suite, "testcase", {"classname": "mpt.check", "name": name, "time": f"{seconds:.3f}"})
    if failure:
        ET.SubElement(case, "failure", {"message": failure, "type": "TargetNotMet"}).text = details or failure
    if error:
        ET.SubElement(case, "error", {"message": error, "type": error_type}).text = details or error
    if output:
        ET.SubElement(case, "system-out").text = output
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _write_junit(path: str, text: str) -> None:
    from tuner.errors import ConfigError
    from tuner.fileio import atomic_write_text

    target = Path(path)
    if target.is_dir():
        raise ConfigError(f"--junit {path} is a folder; give a file name such as {Path(path) / 'mpt-check.xml'}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(target, text)
    except OSError as exc:
        raise ConfigError(f"cannot write --junit {path}: {exc.strerror or exc}") from None


@click.command("check", epilog=EPILOG)
@click.argument("plan_dir", metavar="DIR", required=False)
@click.option("--model-file", default=None, metavar="MODEL.py[:build_fn]",
              help="The model file (default: the one plan.yaml's header names, relative to DIR).")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--tolerance", type=float, default=None, metavar="X",
              help="Override the plan's tolerance (default: the one it was tuned with, in plan.yaml).")
@click.option("--checkpoint", is_flag=True,
              help="Evaluate DIR/model.safetensors (the stored weights) instead of the weights build_model gives "
                   "now.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the verdict line.")
@click.option("--junit", "junit_path", default=None, metavar="FILE", help="Also write a JUnit XML report to FILE.")
@config_option("check", CONFIG_PARAMS)
@user_code_options
@guarded
def check_cmd(plan_dir: str | None, model_file: str | None, device: str, tolerance: float | None, checkpoint: bool,
              as_json: bool, junit_path: str | None, config_path: str | None, model_fn: str | None,
              eval_fn: str | None, inputs_fn: str | None) -> None:
    """Check that a committed plan still meets its target (exit 0) or not (exit 3).

    Re-evaluates the FP32 baseline and the model under the plan in DIR (the
    folder `mpt tune --out` wrote), and compares with the target the plan's
    tolerance gives against the new baseline. Run it in CI after a model or
    data change: it fails when the change broke the plan.
    """
    from tuner.errors import ConfigError, DeviceError, MptError, PlanMismatchError, UserCodeError

    if not plan_dir:
        raise ConfigError("missing DIR: give the plan folder as the argument or as `out:` in --config")
    t0 = time.monotonic()
    case_name = f"plan {plan_dir}"
    try:
        result = check_plan(plan_dir, model_file, model_fn=model_fn, eval_fn=eval_fn, inputs_fn=inputs_fn,
                            device=device, checkpoint=checkpoint, tolerance=tolerance)
    except MptError as exc:
        code = (exitcodes.USER_CODE if isinstance(exc, UserCodeError) else
                exitcodes.USAGE if isinstance(exc, (ConfigError, PlanMismatchError, DeviceError))
                else exitcodes.INTERNAL)  # the same mapping as cli.common.guarded
        if junit_path:
            _write_junit(junit_path, junit_xml(case_name, seconds=time.monotonic() - t0, error=str(exc),
                                               error_type=type(exc).__name__))
        if as_json:
            json.dump({"status": "error", "exit_code": code, "error": str(exc), "plan": plan_dir},
                      sys.stdout, indent=1)
            sys.stdout.write("\n")
        raise
    verdict = result.verdict()
    if not result.passed:
        detail = (f"{verdict}\nThe plan in {plan_dir} no longer meets its target on the model as it is now: "
                  "re-run `mpt tune` and commit the new plan.")
    else:
        detail = verdict
    if junit_path:
        case_name = f"{Path(result.model).name} {result.dtype} plan {plan_dir}"
        _write_junit(junit_path, junit_xml(case_name, seconds=result.seconds,
                                           failure=None if result.passed else verdict, details=detail,
                                           output=verdict))
    if as_json:
        json.dump(result.to_dict(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        for w in result.warnings:
            warn(w)
        out = console()
        out.print(verdict, markup=False)
        if not result.passed:
            out.print(f"the plan in {plan_dir} no longer meets its target: re-run `mpt tune` and commit the new "
                      "plan", markup=False)
    if not result.passed:
        click.get_current_context().exit(exitcodes.TARGET_NOT_MET)

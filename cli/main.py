"""The `mpt` command: a thin click layer over the `tuner` library."""
from __future__ import annotations

import click

from . import exitcodes
from .check_cmd import check_cmd
from .inspect_cmd import inspect_cmd
from .options import DEBUG
from .presets_cmd import presets_cmd
from .tune_cmd import tune_cmd

HELP = f"""mpt: find which ops of a PyTorch model can run in bfloat16/float16, and prove it.

\b
Your model file defines build_model() -> nn.Module, evaluate(model) -> float
and optionally example_inputs() -> tuple. Point at another function with
MODEL.py:NAME or the --build/--eval/--inputs options.

\b
Start with:
  mpt presets                               # the shipped op-list presets
  mpt inspect examples/digits_cnn.py        # per-op precision, reason, error
  mpt tune examples/digits_sensor.py --dtype bf16   # search FP32 fallbacks
  mpt check mpt-out                         # CI gate: does the plan still hold?

{exitcodes.HELP}
"""


@click.group(help=HELP, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="mpt-tuner", prog_name="mpt")
@DEBUG
@click.pass_context
def main(ctx: click.Context) -> None:
    ctx.ensure_object(dict)


for _command in (inspect_cmd, tune_cmd, check_cmd, presets_cmd):
    main.add_command(_command)

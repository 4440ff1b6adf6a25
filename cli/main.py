"""The `mpt` command: a thin click layer over the `tuner` library."""
from __future__ import annotations

import atexit
import sys
import threading
from typing import Any

import click

from tuner.core.launch_env import end_process, is_torchrun_worker

from . import exitcodes
from .check_cmd import check_cmd
from .inspect_cmd import inspect_cmd
from .options import DEBUG
from .presets_cmd import presets_cmd
from .render import err
from .tune_cmd import tune_cmd

HELP = f"""mpt: find which ops of a PyTorch model can run in bfloat16/float16, and prove it.

\b
Your model file defines build_model() -> nn.Module, evaluate(model) -> float
and optionally example_inputs() -> tuple. Point at another function with
MODEL.py:NAME or the --build/--eval/--inputs options. No evaluate? Give
--metric (agreement, cosine, kl, ...) with --data inputs. A Hugging Face
folder (save_pretrained) needs no model file: hf:DIR --data FILE.

\b
Start with:
  mpt presets                               # the shipped op-list presets
  mpt inspect examples/digits_cnn.py        # per-op precision, reason, error
  mpt tune examples/digits_sensor.py --dtype bf16   # search FP32 fallbacks
  mpt tune hf:DIR --data inputs.safetensors         # a saved HF model folder
  mpt check mpt-out                         # CI gate: does the plan still hold?

{exitcodes.HELP}
"""


def _stray_threads() -> list[threading.Thread]:
    """Threads the user's code started and left running that would keep the process alive (not daemons)."""
    return [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]


class MptGroup(click.Group):
    """The `mpt` group: a process that ran `mpt` ends when its work is done.

    When the command is over (outputs written, the output folder's lock released) and a thread the user's
    code started is still running, Python would wait for it at exit, forever for a loop; mpt says so once
    and ends the process with its exit code. A torchrun worker also ends at once, without Python's and
    C++'s teardown (after the exit handlers): a model sharded with FSDP2 keeps its gloo process group alive past
    `destroy_process_group` (its threads still run), and that group torn down at interpreter exit
    intermittently aborts the process ("terminate called without an active exception", exit -6) after a
    tune that succeeded. Only when run as the program (no `args` given, as the `mpt` script and
    `python -m mpt_cli` call it), never inside a caller's process (click's CliRunner, a test).
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise _one_line(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            raise _one_line(exc) from None

    def main(self, args: Any = None, *rest: Any, **kwargs: Any) -> Any:
        if args is not None:
            return super().main(args, *rest, **kwargs)
        try:
            return super().main(args, *rest, **kwargs)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            stray = _stray_threads()
            if stray:
                names = ", ".join(t.name for t in stray[:5]) + (", ..." if len(stray) > 5 else "")
                print(f"mpt: warning: your code left {len(stray)} thread(s) running ({names}); mpt exits without "
                      "waiting for them", file=sys.stderr)
                end_process(code)
            if is_torchrun_worker():
                atexit._run_exitfuncs()  # what the user's code registered still runs (threads joined: no stray)
                end_process(code)
            raise


class OneLineUsageError(click.UsageError):
    """click's usage error (a bad choice, an unknown option) as every mpt error is: one `mpt: error:` line
    on stderr naming the help to read, exit code 2, instead of click's usage block and `Error:` line."""

    def __init__(self, exc: click.UsageError) -> None:
        super().__init__(exc.format_message(), exc.ctx)

    def show(self, file: Any = None) -> None:
        words = ["mpt", *(self.ctx.command_path.split()[1:] if self.ctx is not None else [])]
        where = f"; see {' '.join(words)} --help"
        err(" ".join(self.format_message().split()).rstrip(".") + where)


def _one_line(exc: click.UsageError) -> click.UsageError:
    """click's own `mpt` / `mpt tune` with no arguments shows the help (NoArgsIsHelpError): left as it is."""
    no_args = getattr(click.exceptions, "NoArgsIsHelpError", ())
    return exc if isinstance(exc, (OneLineUsageError, no_args)) else OneLineUsageError(exc)


@click.group(cls=MptGroup, help=HELP,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="mpt-tuner", prog_name="mpt")
@DEBUG
@click.pass_context
def main(ctx: click.Context) -> None:
    ctx.ensure_object(dict)


for _command in (inspect_cmd, tune_cmd, check_cmd, presets_cmd):
    main.add_command(_command)

"""Shared CLI plumbing: turning exceptions into one-line errors and exit codes."""
from __future__ import annotations

import functools
import signal
import sys
import traceback
from typing import Any, Callable

import click

from . import exitcodes
from .render import err


class Interrupted(Exception):
    """Raised from a SIGTERM handler so cleanup runs like for Ctrl-C."""


def _sigterm(signum: int, frame: Any) -> None:
    raise Interrupted()


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a command body; map errors to (one-line message, exit code). --debug shows the traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from tuner.errors import ConfigError, DeviceError, MptError, PlanMismatchError, UserCodeError

        ctx = click.get_current_context()
        debug = bool((ctx.obj or {}).get("debug"))
        previous = None
        try:
            previous = signal.signal(signal.SIGTERM, _sigterm)
        except ValueError:  # not the main thread (e.g. some test runners)
            previous = None
        try:
            return fn(*args, **kwargs)
        except (KeyboardInterrupt, Interrupted):
            err("interrupted; finished work was kept (rerun with --resume to continue a tune)")
            ctx.exit(exitcodes.INTERRUPTED)
        except UserCodeError as exc:
            err(str(exc))
            if debug and exc.original is not None:
                traceback.print_exception(exc.original, file=sys.stderr)
            elif exc.original is not None:
                print("mpt: (run with --debug for the full traceback)", file=sys.stderr)
            ctx.exit(exitcodes.USER_CODE)
        except (ConfigError, PlanMismatchError, DeviceError) as exc:
            err(str(exc))
            if debug:
                traceback.print_exc()
            ctx.exit(exitcodes.USAGE)
        except MptError as exc:
            err(str(exc))
            if debug:
                traceback.print_exc()
            ctx.exit(exitcodes.INTERNAL)
        except click.exceptions.Exit:
            raise
        except click.ClickException:
            raise
        except Exception as exc:  # a bug in mpt
            err(f"internal error: {type(exc).__name__}: {exc} (run with --debug and report it)")
            if debug:
                traceback.print_exc()
            ctx.exit(exitcodes.INTERNAL)
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)

    return wrapper


def dtype_option(default: str | None = "bf16") -> Callable[..., Any]:
    return click.option("--dtype", type=click.Choice(["bf16", "fp16", "bfloat16", "float16", "half"],
                                                     case_sensitive=False),
                        default=default, show_default=default is not None,
                        help="Lower precision to use (bf16/bfloat16 or fp16/float16/half).")


def user_code_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--inputs", "inputs_fn", metavar="NAME|FILE.py:NAME",
                      help="Function giving example inputs (default: example_inputs).")(fn)
    fn = click.option("--eval", "eval_fn", metavar="NAME|FILE.py:NAME",
                      help="Metric function evaluate(model) -> float (default: evaluate).")(fn)
    fn = click.option("--model", "model_fn", metavar="NAME|FILE.py:NAME",
                      help="Model builder build_model() -> nn.Module (default: build_model).")(fn)
    return fn

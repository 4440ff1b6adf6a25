"""Shared CLI plumbing: turning exceptions into one-line errors and exit codes."""
from __future__ import annotations

import functools
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

import click

from . import exitcodes
from .render import err

from tuner.errors import Interrupted


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


class ConfigUsageError(click.ClickException):
    """A bad --config file: printed as `mpt: error: ...` (every problem listed), exit code 2."""

    exit_code = exitcodes.USAGE

    def show(self, file: Any = None) -> None:
        err(self.format_message())


def config_option(command: str, params: dict[str, str] | None = None) -> Callable[..., Any]:
    """`--config FILE`: an eager option whose callback loads the YAML into click's default_map.

    Keys are the option names (tuner.config.KEYS); `params` maps a key to the
    command's parameter name where they differ (`model` -> `model_file`).
    Values given on the command line win over the file, which wins over the
    defaults. Paths in the file are relative to the file's folder.
    """
    mapping = dict(params or {})

    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if not value or ctx.resilient_parsing:
            return value
        from tuner.config import load_config
        from tuner.errors import ConfigError

        try:
            values = load_config(value, command=command)
        except ConfigError as exc:
            raise ConfigUsageError(str(exc)) from None
        ctx.default_map = {**(ctx.default_map or {}), **{mapping.get(k, k): v for k, v in values.items()}}
        return value

    return click.option("--config", "config_path", default=None, metavar="FILE", is_eager=True, callback=callback,
                        help="YAML config: keys are the long option names (max_evals, lower_is_better, ...), "
                             "model for the model file, plus version: 1. Paths in it are relative to the file; "
                             "flags on the command line win.")


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


# --- what plan.yaml's header says about the model, for `mpt check` ---------------------------------------------
HEADER_FIELDS = ("model", "build", "eval", "inputs")


def _relative_to(path: Path, folder: Path) -> str:
    """`path` relative to `folder` when they share more than the file-system root, else absolute."""
    path, folder = path.resolve(), folder.resolve()
    if os.path.commonpath([str(path), str(folder)]) == path.anchor:
        return path.as_posix()
    return Path(os.path.relpath(path, folder)).as_posix()


def _function_spec(given: str | None, model_path: Path, out: Path) -> str | None:
    """A --model/--eval/--inputs value with its file part (if any) made relative to `out`."""
    if given is None:
        return None
    head, sep, tail = given.rpartition(":")
    file_text, name = (head, tail) if sep and head.lower().endswith(".py") else (given, "")
    if not file_text.lower().endswith(".py"):
        return given
    candidate = Path(file_text).expanduser()
    if not candidate.is_absolute() and not candidate.exists() and (model_path.parent / candidate).exists():
        candidate = model_path.parent / candidate
    return _relative_to(candidate, out) + (f":{name}" if name else "")


def plan_header_spec(user: Any, out: Path, *, model_fn: str | None, eval_fn: str | None,
                     inputs_fn: str | None) -> str:
    """Header lines for plan.yaml: `model: PATH[:build_fn]` relative to the output folder, then any
    `build:`/`eval:`/`inputs:` the user named, so `mpt check DIR` can rebuild the same model."""
    from tuner.loader import DEFAULT_BUILD

    spec = _relative_to(Path(user.path), out)
    build_name = getattr(user.build_fn, "__name__", DEFAULT_BUILD)
    if model_fn is None and build_name != DEFAULT_BUILD:
        spec += f":{build_name}"
    lines = [spec]
    for key, given in (("build", model_fn), ("eval", eval_fn), ("inputs", inputs_fn)):
        value = _function_spec(given, Path(user.path), out)
        if value is not None:
            lines.append(f"{key}: {value}")
    return "\n".join(lines)


def read_plan_header(plan_file: Path) -> dict[str, str]:
    """The `# model: ...`, `# build: ...`, `# eval: ...`, `# inputs: ...` lines `mpt tune` wrote, paths as
    written (relative to the plan's folder)."""
    found: dict[str, str] = {}
    try:
        with open(plan_file, encoding="utf-8") as fh:
            for line in fh:
                if not line.startswith("#"):
                    break
                key, sep, value = line[1:].strip().partition(":")
                if sep and key.strip() in HEADER_FIELDS and key.strip() not in found and value.strip():
                    found[key.strip()] = value.strip()
    except (OSError, UnicodeDecodeError):
        pass
    return found

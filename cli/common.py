"""Shared CLI plumbing: options checked by the library, exceptions turned into one-line errors and exit codes."""
from __future__ import annotations

import functools
import re
import signal
import sys
import traceback
from typing import Any, Callable

import click

from . import exitcodes
from .options import command_values, display_names, schema
from .render import err

from tuner.errors import (ConfigError, DeployError, DeviceError, Interrupted, MptError, OutputError, PlanMismatchError,
                          UserCodeError)

_KEY = re.compile(r"[a-z][a-z0-9_]*")
_QUOTED = re.compile(r"`([a-z][a-z0-9_]*)`")


def _sigterm(signum: int, frame: Any) -> None:
    raise Interrupted()


def exit_code(exc: MptError) -> int:
    """The documented exit code for a library error."""
    if isinstance(exc, UserCodeError):
        return exitcodes.USER_CODE
    if isinstance(exc, (ConfigError, PlanMismatchError, DeviceError, OutputError, DeployError)):
        return exitcodes.USAGE
    return exitcodes.INTERNAL


def message(exc: MptError, command: click.Command | None = None) -> str:
    """The error's text with the options it names spelled as `command` spells them.

    The library names an option by its key: as the subject of a ConfigError
    problem (`max_evals: ...`, see ConfigError.fields) or in backticks inside
    a message (`resume`). Here they become `--max-evals`, `--resume`, or the
    argument's metavar.
    """
    if command is None or not isinstance(exc, (ConfigError, OutputError)):
        return str(exc)
    names = display_names(command)

    def spell(text: str) -> str:
        return _QUOTED.sub(lambda m: names.get(m.group(1), m.group(0)), text)

    if not isinstance(exc, ConfigError):
        return spell(str(exc))
    problems = []
    for problem, subject in zip(exc.errors, exc.fields):
        if subject and problem.startswith(subject + ":"):
            problem = _KEY.sub(lambda m: names.get(m.group(), m.group()), subject) + problem[len(subject):]
        problems.append(spell(problem))
    return str(ConfigError(problems, source=exc.source))


def check_command_options(ctx: click.Context) -> None:
    """The library's checks on the values given on the command line (a --config file was checked on load)."""
    from tuner.config import check_options

    values, given = command_values(ctx)
    if values:
        check_options(values, schema([ctx.command]), given=given)


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a command body after the library checked its options; map errors to (one-line message, exit code).

    --debug shows the traceback.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        debug = bool((ctx.obj or {}).get("debug"))
        previous = None
        try:
            previous = signal.signal(signal.SIGTERM, _sigterm)
        except ValueError:  # not the main thread (e.g. some test runners)
            previous = None
        try:
            check_command_options(ctx)
            return fn(*args, **kwargs)
        except (KeyboardInterrupt, Interrupted):
            err("interrupted; finished work was kept (rerun with --resume to continue a tune)")
            ctx.exit(exitcodes.INTERRUPTED)
        except MptError as exc:
            err(message(exc, ctx.command))
            original = exc.original if isinstance(exc, UserCodeError) else None
            if debug and original is not None:
                traceback.print_exception(original, file=sys.stderr)
            elif original is not None:
                print("mpt: (run with --debug for the full traceback)", file=sys.stderr)
            elif debug:
                traceback.print_exc()
            ctx.exit(exit_code(exc))
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

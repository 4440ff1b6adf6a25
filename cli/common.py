"""Shared CLI plumbing: library exceptions turned into one-line errors (options spelled as flags) and exit codes."""
from __future__ import annotations

import functools
import re
import signal
import sys
import traceback
from collections.abc import Callable
from typing import Any

import click

from tuner.core.errors import (
    ConfigError,
    DeployError,
    DeviceError,
    Interrupted,
    MptError,
    OutOfMemory,
    OutputError,
    PlanMismatchError,
    UserCodeError,
)
from tuner.core.memory import find_out_of_memory, out_of_memory

from . import exitcodes
from .options import display_names
from .render import err

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
    for problem, subject in zip(exc.errors, exc.fields, strict=False):
        if subject and problem.startswith(subject + ":"):
            problem = _KEY.sub(lambda m: names.get(m.group(), m.group()), subject) + problem[len(subject):]
        problems.append(spell(problem))
    return str(ConfigError(problems, source=exc.source))


def join_ranks(ctx: click.Context, device: str) -> Any:
    """The torchrun ranks this command runs on (tuner.search.distributed.Ranks; one process without torchrun).

    Kept in the context so a failure on this rank stops them all (`guarded`), and watched so a failure on
    another rank ends this one with the same exit code, reported once by rank 0.
    """
    from tuner.search.distributed import Ranks

    ctx.ensure_object(dict)["joining"] = True  # an error now is every rank's to say: there is no group yet
    ranks = Ranks.from_env(device)
    ctx.obj["joining"] = False
    ctx.obj["ranks"] = ranks
    ranks.watch(_report_abort, lost_code=exitcodes.USER_CODE)
    return ranks


def _report_abort(abort: Any) -> None:
    """Rank 0's one report of the failure that stopped every rank (tuner.search.distributed.Abort)."""
    err(f"rank {abort.rank}: {abort.message} (all ranks stopped)")
    for note in abort.notes:
        print(note, file=sys.stderr)


def _fail(ctx: click.Context, code: int, text: str, notes: tuple[str, ...] = (),
          trace: Callable[[], None] | None = None) -> None:
    """End the command with `code` after one error line, `trace` (--debug) and `notes`.

    Under torchrun every rank ends with it and rank 0 reports it; the traceback stays on the failing rank.
    """
    ranks = (ctx.obj or {}).get("ranks")
    if ranks is not None and ranks.distributed:
        if trace is not None:
            trace()
        ranks.abort(code, text, notes, report=_report_abort)
    from tuner.core.launch_env import is_follower_by_env

    if not is_follower_by_env() or (ctx.obj or {}).get("joining"):  # the same error on every rank: rank 0 says it
        err(text)
        if trace is not None:
            trace()
        for note in notes:
            print(note, file=sys.stderr)
    ctx.exit(code)


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a command body; map library errors to (one-line message, exit code).

    --debug shows the traceback (on the rank that failed, under torchrun).
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
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                if find_out_of_memory(exc) is None:
                    raise
                raise out_of_memory(exc, f"running mpt {ctx.command.name}") from exc  # one message, one code
        except (KeyboardInterrupt, Interrupted) as exc:  # an Interrupted with a text says what was kept
            _fail(ctx, exitcodes.INTERRUPTED, str(exc) if isinstance(exc, Interrupted) and str(exc) else
                  "interrupted; finished work was kept (rerun with --resume to continue a tune)")
        except MptError as exc:
            original = exc.original if isinstance(exc, (UserCodeError, OutOfMemory)) else None
            notes: tuple[str, ...] = ()
            trace = None
            if debug and original is not None:
                trace = functools.partial(traceback.print_exception, original, file=sys.stderr)
            elif original is not None:
                notes = ("mpt: (run with --debug for the full traceback)",)
            elif debug:
                trace = functools.partial(traceback.print_exception, exc, file=sys.stderr)
            _fail(ctx, exit_code(exc), message(exc, ctx.command), notes, trace)
        except click.exceptions.Exit:
            raise
        except click.ClickException:
            raise
        except Exception as exc:  # noqa: BLE001 - a bug in mpt: one line, exit 1, the traceback with --debug
            _fail(ctx, exitcodes.INTERNAL, f"internal error: {type(exc).__name__}: {exc} (run with --debug and "
                  "report it)", trace=functools.partial(traceback.print_exception, exc, file=sys.stderr)
                  if debug else None)
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)

    return wrapper

"""What torchrun's environment says about this process, readable before torch is imported.

The CLI asks it to stay silent on ranks other than 0 from its first line; `tuner.search.distributed` reads the
same variables when it joins the process group.
"""
from __future__ import annotations

import os
import sys
from typing import NoReturn

from tuner.core.errors import ConfigError

__all__ = ["end_process", "env_int", "env_world_size", "is_follower_by_env", "is_torchrun_worker",
           "launch_problem"]


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not a whole number (torchrun sets it)") from None


def env_world_size() -> int:
    """WORLD_SIZE as torchrun sets it; 1 when it is not set."""
    return env_int("WORLD_SIZE", 1)


def is_follower_by_env() -> bool:
    """True in a torchrun worker other than rank 0 (before the process group exists): it stays silent."""
    try:
        return env_world_size() > 1 and env_int("RANK", 0) > 0
    except ConfigError:
        return False


def launch_problem(size: int, *, group_ready: bool) -> str:
    """Why this process with WORLD_SIZE=`size` is not a torchrun worker ('' when it looks like one).

    torchrun sets RANK, MASTER_ADDR and MASTER_PORT with WORLD_SIZE; a WORLD_SIZE left in the shell (or
    set by hand) without them cannot join anything. `group_ready`: the user's code already made the
    process group, so the rendezvous variables are not needed.
    """
    needed = ("RANK",) if group_ready else ("RANK", "MASTER_ADDR", "MASTER_PORT")
    missing = [n for n in needed if not os.environ.get(n, "").strip()]
    if not missing:
        return ""
    names = " and ".join([", ".join(missing[:-1]), missing[-1]] if len(missing) > 1 else missing)
    return (f"WORLD_SIZE={size} is set but {names} {'is' if len(missing) == 1 else 'are'} not, so "
            f"this is not a torchrun worker: start mpt with `torchrun --nproc-per-node {size} --no-python mpt ...`, "
            "or unset WORLD_SIZE for one process")


def is_torchrun_worker() -> bool:
    """True in a process torchrun started as one of several ranks (WORLD_SIZE > 1)."""
    try:
        return env_world_size() > 1
    except ConfigError:
        return False


def end_process(code: int) -> NoReturn:
    """Flush what was printed and end the process with `code` at once: no exit handlers, no interpreter or
    C++ teardown (a rank ending after a failure elsewhere, or after a torchrun tune whose model kept its
    process group alive: cli/main.py)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream
            pass
    os._exit(code)

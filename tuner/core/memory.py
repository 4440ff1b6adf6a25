"""Out of memory, recognized wherever it hits: one message and one exit code (OutOfMemory, exit 2).

torch reports it as `torch.OutOfMemoryError` (CUDA), a RuntimeError from its
CPU allocator ("can't allocate memory"), or Python's MemoryError; mpt may
have wrapped it (UserCodeError.original, `__cause__`). `find_out_of_memory`
finds it in any of those; `out_of_memory` makes the one error mpt reports.
"""
from __future__ import annotations

import gc
import sys

from tuner.core.errors import OutOfMemory, UserCodeError, exc_line

_FRAGMENTS = ("out of memory", "can't allocate memory", "cannot allocate memory")


def is_out_of_memory(exc: BaseException) -> bool:
    torch = sys.modules.get("torch")  # not imported: no torch error exists (the CLI imports this before torch)
    if isinstance(exc, MemoryError) or (torch is not None and isinstance(exc, torch.OutOfMemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(f in str(exc).lower() for f in _FRAGMENTS)


def find_out_of_memory(exc: BaseException) -> BaseException | None:
    """The out-of-memory error `exc` is or was raised from (None when there is none)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        cur = todo.pop()
        if cur is None or id(cur) in seen:
            continue
        seen.add(id(cur))
        if isinstance(cur, OutOfMemory) or is_out_of_memory(cur):
            return cur
        todo += [getattr(cur, "original", None), cur.__cause__, cur.__context__]
    return None


def out_of_memory(exc: BaseException, what: str) -> OutOfMemory:
    """The one error for an out-of-memory `exc` (already one: itself) while doing `what`."""
    found = find_out_of_memory(exc) or exc
    if isinstance(found, OutOfMemory):
        return found
    where = exc.where if isinstance(exc, UserCodeError) else None
    return OutOfMemory(f"out of memory while {what}{f' ({where})' if where else ''}: {exc_line(found, 200)}",
                       original=found)


def free_memory() -> None:
    """Give back what can be given back before a retry."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()

"""The C heap during mpt's own passes: large blocks given back to the system as soon as they are freed.

glibc's malloc serves a block from its heap unless it is larger than the mmap threshold, and that threshold
adapts: once a large block (a cast weight, a big activation) is freed, the threshold rises to its size, up
to 32 MiB. From then on the many 0.5-30 MiB tensors of a forward come from the heap, and a pass that holds
a graph for its backward (the gradient ranking) leaves the heap fragmented: at 1.1B parameters the ranking
raised the tune's peak memory 0.8 GiB above the model, 0.55 GiB of it still held after the pass (issue 20).

`compact_heap()` sets the threshold back to glibc's starting 128 KiB for the block, so each large tensor is
its own mapping and goes back to the system when freed, then trims the heap. After the block the thresholds
are left where glibc's adaptation would have taken them (32 MiB, and twice that to trim): setting them is
what stops the adaptation, and a fixed low threshold made every later forward (the user's evaluate too)
about 15% slower with its page faults. Elsewhere than Linux with glibc it does nothing.
"""
from __future__ import annotations

import contextlib
import ctypes
import sys
from collections.abc import Iterator
from typing import Any

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (malloc.h)
PASS_MMAP_THRESHOLD = 128 << 10  # glibc's threshold before it adapts
AFTER_MMAP_THRESHOLD = 32 << 20  # where it adapts to, at most, on a 64-bit system (DEFAULT_MMAP_THRESHOLD_MAX)


def _glibc() -> Any | None:
    """The C library when it is glibc (mallopt and malloc_trim), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "malloc_trim"):
        return None
    return libc


@contextlib.contextmanager
def compact_heap(libc: Any | None = None) -> Iterator[None]:
    """Large blocks mapped apart and returned when freed inside the block; the heap trimmed after it.
    `libc`: the C library to call (default: this process's glibc; tests pass a stand-in)."""
    libc = _glibc() if libc is None else libc
    if libc is None:
        yield
        return
    libc.mallopt(M_MMAP_THRESHOLD, PASS_MMAP_THRESHOLD)
    try:
        yield
    finally:
        libc.mallopt(M_MMAP_THRESHOLD, AFTER_MMAP_THRESHOLD)
        libc.mallopt(M_TRIM_THRESHOLD, 2 * AFTER_MMAP_THRESHOLD)
        libc.malloc_trim(0)

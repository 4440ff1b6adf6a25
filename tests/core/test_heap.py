"""tuner.core.heap: the mmap threshold lowered for mpt's own passes and put where glibc would have it after."""
from __future__ import annotations

import sys

import pytest

from tuner.core.heap import (
    AFTER_MMAP_THRESHOLD,
    M_MMAP_THRESHOLD,
    M_TRIM_THRESHOLD,
    PASS_MMAP_THRESHOLD,
    _glibc,
    compact_heap,
)


class _Libc:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append(("mallopt", param, value))
        return 1

    def malloc_trim(self, pad: int) -> int:
        self.calls.append(("trim", pad))
        return 1


def test_the_pass_runs_with_the_low_threshold_and_the_heap_is_trimmed_after_even_on_error():
    libc = _Libc()
    with pytest.raises(RuntimeError), compact_heap(libc):
        assert libc.calls == [("mallopt", M_MMAP_THRESHOLD, PASS_MMAP_THRESHOLD)]
        raise RuntimeError("the pass failed")
    assert libc.calls[1:] == [("mallopt", M_MMAP_THRESHOLD, AFTER_MMAP_THRESHOLD),
                              ("mallopt", M_TRIM_THRESHOLD, 2 * AFTER_MMAP_THRESHOLD), ("trim", 0)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_on_this_linux_the_real_library_takes_the_calls():
    libc = _glibc()
    if libc is None:
        pytest.skip("not glibc")
    import torch

    with compact_heap():
        x = torch.ones(1 << 20)  # 4 MiB: its own mapping here
        del x
    assert libc.mallopt(M_MMAP_THRESHOLD, AFTER_MMAP_THRESHOLD) == 1  # glibc accepts the values it was given

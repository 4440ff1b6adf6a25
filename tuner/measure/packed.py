"""An FP32 parameter held in bf16 inside its own storage, and put back bit for bit.

A trial runs the model with its lowered parameters stored lowered, as the checkpoint stores them
(`deployed.stored_as`). Keeping the FP32 tensor aside meanwhile costs half the lowered parameters' bytes again:
on a large model that is most of mpt's memory above the model itself. Instead the FP32 storage holds both
halves of the information: its first half the rounded lower-precision values (the tensor the trial computes
with, at the parameter's own address), its second half each value's residual, `fp32_bits - low_bits << 16`,
which round-to-nearest keeps within [-2**15, 2**15] (bf16 is FP32's top half, rounded; fp16 is not, so an
fp16 plan keeps the FP32 tensor aside). The one residual int16 cannot hold (+2**15: a tie
rounded down) is listed apart. Undoing it rebuilds the exact FP32 bits in place; the parameter keeps its
address, shape and version counter, so the keeper sees the model as built.

Only where that is safe: a contiguous FP32 CPU tensor that owns its whole storage, alone (no other tensor,
view, parameter or buffer shares it: those would read the packed bytes), every residual in range (NaN
payloads may not be); anything else is left to the caller (`pack` returns None).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor, nn

_CHUNK = 1 << 18  # elements converted at a time: bounds the temporaries and keeps them in cache (2-3x faster than 4M)
_TIE = 1 << 15  # the residual int16 cannot hold


def _view(storage: torch.UntypedStorage, dtype: torch.dtype, offset: int, n: int) -> Tensor:
    return torch.empty(0, dtype=dtype).set_(storage, offset, (n,), (1,))


def _alone(p: nn.Parameter) -> bool:
    """No other tensor shares `p`'s storage: no view a forward keeps (a cached `weight.t()`), no second
    parameter or buffer over it. (The count is the parameter plus the storage object asked for it.)"""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    return use_count is not None and use_count(p.untyped_storage()._cdata) <= 2


def pack(p: nn.Parameter, dtype: torch.dtype) -> Callable[[], None] | None:
    """Store `p` in `dtype` (bf16: its values rounded) in place; returns the undo, or None when `p` does not
    qualify (see the module docstring) and nothing was changed."""
    if not _alone(p):
        return None
    t = p.data
    n = t.numel()
    if (dtype != torch.bfloat16 or t.dtype != torch.float32 or t.device.type != "cpu" or n == 0
            or not t.is_contiguous() or t.storage_offset() != 0 or t.untyped_storage().nbytes() != 4 * n):
        return None
    storage, shape = t.untyped_storage(), t.shape
    bits = t.reshape(-1).view(torch.int32).numpy()  # integer work in numpy, into buffers made once: fresh
    residual = np.empty(n, dtype=np.int16)         # large temporaries cost more in page faults than in math
    low = _view(storage, torch.int16, 0, n).numpy()  # the first half of the storage: where the low values go
    wide, rest = np.empty(min(n, _CHUNK), np.int32), np.empty(min(n, _CHUNK), np.int32)
    ties: list[np.ndarray] = []
    for start in range(0, n, _CHUNK):
        chunk = bits[start:start + _CHUNK]
        m = chunk.size
        rounded = torch.from_numpy(chunk).view(torch.float32).to(dtype).view(torch.int16).numpy()
        wide[:m] = rounded
        np.left_shift(wide[:m], 16, out=wide[:m])
        np.subtract(chunk, wide[:m], out=rest[:m])
        lo, hi = int(rest[:m].min()), int(rest[:m].max())
        if lo < -_TIE or hi > _TIE:  # round-to-nearest never gives it (NaN payloads may): keep every bit
            _abandon(storage, residual, low, ties, start, n)
            return None
        if hi == _TIE:
            ties.append(np.flatnonzero(rest[:m] == _TIE) + start)
        residual[start:start + m] = rest[:m]  # +2**15 wraps to -2**15: listed in `ties`
        low[start:start + m] = rounded  # overwrites FP32 elements already read (module docstring)
    _view(storage, torch.int16, n, n).numpy()[:] = residual
    del residual
    p.data = _view(storage, dtype, 0, n).view(shape)
    tied = np.concatenate(ties) if ties else np.empty(0, dtype=np.int64)
    return lambda: _unpack(p, storage, n, shape, tied)


def _abandon(storage: torch.UntypedStorage, residual: np.ndarray, low: np.ndarray, ties: list[np.ndarray],
             done: int, n: int) -> None:
    """Undo a pack that stopped at element `done` (the first `done` values are packed, the rest untouched)."""
    tied = np.concatenate(ties) if ties else np.empty(0, dtype=np.int64)
    restored = _restore(low[:done], residual[:done], tied)
    whole = _view(storage, torch.int32, 0, n).numpy()
    whole[:done] = restored


def _restore(low: np.ndarray, residual: np.ndarray, tied: np.ndarray) -> np.ndarray:
    rest = residual.astype(np.int32)
    if tied.size:
        rest[tied] = _TIE
    return (low.astype(np.int32) << 16) + rest


def _unpack(p: nn.Parameter, storage: torch.UntypedStorage, n: int, shape: torch.Size, tied: np.ndarray) -> None:
    """Rebuild the FP32 bits in place, last chunk first: element j's 4 bytes cover low values of elements
    2j and 2j+1, which are read by then."""
    residual = _view(storage, torch.int16, n, n).numpy().copy()
    low = _view(storage, torch.int16, 0, n).numpy()
    out = _view(storage, torch.int32, 0, n).numpy()
    wide, rest = np.empty(min(n, _CHUNK), np.int32), np.empty(min(n, _CHUNK), np.int32)
    for start in reversed(range(0, n, _CHUNK)):
        stop = min(n, start + _CHUNK)
        m = stop - start
        wide[:m] = low[start:stop]  # read before the writes below reach them
        np.left_shift(wide[:m], 16, out=wide[:m])
        rest[:m] = residual[start:stop]
        if tied.size:
            rest[tied[(tied >= start) & (tied < stop)] - start] = _TIE
        np.add(wide[:m], rest[:m], out=out[start:stop])
    p.data = _view(storage, torch.float32, 0, n).view(shape)

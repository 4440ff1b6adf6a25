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

Speed: packing is a pass over the weights per trial that changes them, so it runs near memory speed. Every
buffer it works in is made once per batch of parameters (`Scratch`) and reused: a page touched for the first
time costs more than the arithmetic on it (on a loaded VM, 10 ns per element of a fresh int16 buffer against
under 1 ns for the rest of the work; GPT-2 774M packed in 11 s with a fresh residual buffer per parameter, in
under 2 s with one reused).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

_CHUNK = 1 << 16  # elements converted at a time: its buffers (under 1 MB) stay in a core's L2 cache
_TIE = 1 << 15  # the residual int16 cannot hold


def _view(storage: torch.UntypedStorage, dtype: torch.dtype, offset: int, n: int) -> Tensor:
    return torch.empty(0, dtype=dtype).set_(storage, offset, (n,), (1,))


class Scratch:
    """The buffers of packing and unpacking, made once and reused by every parameter of a batch (`HeldLowered`
    makes one per change of plan and drops it after): one int16 buffer as long as the largest parameter (the
    residuals while the FP32 values they would overwrite are still unread) and a chunk's working buffers."""

    def __init__(self) -> None:
        self.chunk = _CHUNK
        self._long = np.empty(0, dtype=np.int16)
        self.rounded = torch.empty(self.chunk, dtype=torch.bfloat16)  # a chunk's rounded values
        self.widened = torch.empty(self.chunk, dtype=torch.float32)  # the same widened back: low_bits << 16
        self.rest = np.empty(self.chunk, dtype=np.int32)
        self.flags = np.empty(self.chunk, dtype=np.bool_)

    def residuals(self, n: int) -> np.ndarray:
        if self._long.size < n:
            self._long = np.empty(n, dtype=np.int16)
        return self._long[:n]


class Unpack:
    """The undo of one `pack`: rebuilds the FP32 bits in place (see `_unpack`)."""

    def __init__(self, p: nn.Parameter, storage: torch.UntypedStorage, n: int, shape: torch.Size,
                 tied: np.ndarray) -> None:
        self._args = (p, storage, n, shape, tied)

    def __call__(self, scratch: Scratch | None = None) -> None:
        _unpack(*self._args, scratch or Scratch())


def _alone(p: nn.Parameter) -> bool:
    """No other tensor shares `p`'s storage: no view a forward keeps (a cached `weight.t()`), no second
    parameter or buffer over it. (The count is the parameter plus the storage object asked for it.)"""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    return use_count is not None and use_count(p.untyped_storage()._cdata) <= 2


def pack(p: nn.Parameter, dtype: torch.dtype, scratch: Scratch | None = None) -> Unpack | None:
    """Store `p` in `dtype` (bf16: its values rounded) in place; returns the undo, or None when `p` does not
    qualify (see the module docstring) and nothing was changed. `scratch`: buffers to reuse (`Scratch`)."""
    if not _alone(p):
        return None
    t = p.data
    n = t.numel()
    if (dtype != torch.bfloat16 or t.dtype != torch.float32 or t.device.type != "cpu" or n == 0
            or not t.is_contiguous() or t.storage_offset() != 0 or t.untyped_storage().nbytes() != 4 * n):
        return None
    s = scratch or Scratch()
    storage, shape = t.untyped_storage(), t.shape
    flat = t.reshape(-1)
    bits = flat.view(torch.int32).numpy()
    residual = s.residuals(n)
    low = _view(storage, torch.int16, 0, n).numpy()  # the first half of the storage: where the low values go
    rounded, widened = s.rounded.view(torch.int16).numpy(), s.widened.view(torch.int32).numpy()
    ties: list[np.ndarray] = []
    for start in range(0, n, s.chunk):
        m = min(s.chunk, n - start)
        s.rounded[:m].copy_(flat[start:start + m])  # torch's rounding, as `.to(dtype)` rounds
        s.widened[:m].copy_(s.rounded[:m])  # exact: the rounded value's FP32 bits, low_bits << 16
        rest = s.rest[:m]
        np.subtract(bits[start:start + m], widened[:m], out=rest)
        lo, hi = int(rest.min()), int(rest.max())
        if lo < -_TIE or hi > _TIE:  # round-to-nearest never gives it (NaN payloads may): keep every bit
            _abandon(storage, residual, low, ties, start, n)
            return None
        if hi == _TIE:
            ties.append(np.flatnonzero(np.equal(rest, _TIE, out=s.flags[:m])) + start)
        residual[start:start + m] = rest  # +2**15 wraps to -2**15: listed in `ties`
        low[start:start + m] = rounded[:m]  # overwrites FP32 elements already read (module docstring)
    _view(storage, torch.int16, n, n).numpy()[:] = residual
    p.data = _view(storage, dtype, 0, n).view(shape)
    tied = np.concatenate(ties) if ties else np.empty(0, dtype=np.int64)
    return Unpack(p, storage, n, shape, tied)


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


def _unpack(p: nn.Parameter, storage: torch.UntypedStorage, n: int, shape: torch.Size, tied: np.ndarray,
            scratch: Scratch) -> None:
    """Rebuild the FP32 bits in place, last chunk first: element j's 4 bytes cover low values of elements
    2j and 2j+1, which are read by then. The residuals are copied out first: the rebuilt values cover them."""
    residual = scratch.residuals(n)
    residual[:] = _view(storage, torch.int16, n, n).numpy()
    low = _view(storage, torch.bfloat16, 0, n)
    out = _view(storage, torch.int32, 0, n).numpy()
    widened, rest = scratch.widened.view(torch.int32).numpy(), scratch.rest
    for start in reversed(range(0, n, scratch.chunk)):
        stop = min(n, start + scratch.chunk)
        m = stop - start
        scratch.widened[:m].copy_(low[start:stop])  # low_bits << 16, read before the writes below reach them
        rest[:m] = residual[start:stop]
        if tied.size:
            rest[tied[(tied >= start) & (tied < stop)] - start] = _TIE
        np.add(widened[:m], rest[:m], out=out[start:stop])
    p.data = _view(storage, torch.float32, 0, n).view(shape)

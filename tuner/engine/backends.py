"""What torch.autocast runs a whole-sequence RNN as, per device type: the engine's configuration for it.

torch.autocast decides at the ATen level, and an `nn.LSTM`/`nn.GRU`/`nn.RNN` reaches ATen as a fused kernel
that depends on the device: on CPU oneDNN's `mkldnn_rnn_layer` takes `torch.lstm` (the CPU lists lower it);
on CUDA cuDNN's `_cudnn_rnn` takes all four (`lstm`, `gru`, `rnn_tanh`, `rnn_relu`) when cuDNN accepts the input
(float32, float16 or float64), and torch.autocast("cuda") runs it through cuDNN's own wrapper
(ATen/cudnn/AutocastRNN.cpp), which casts input, weights and state to float16 whatever autocast's dtype is: a
bf16 tune's LSTM runs in float16 on CUDA (issue 44: the claims said float32). mpt's engine names such a call by
that ATen op (so a list's rule for it decides, as torch.autocast's does) and, where the wrapper picks the dtype
itself (`autocast_decides`), runs the lowered call under torch.autocast, claiming what its kernel computed in
(`tuner.engine.kernels`).

The configuration is data, chosen by each call's device, or given to the engine (`PrecisionEngine(backend=...)`):
the CPU suite runs the CUDA configuration on CPU tensors.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

_CUDNN_DTYPES = frozenset({torch.float32, torch.float16, torch.float64})  # torch.backends.cudnn's tensor dtypes


@dataclass(frozen=True)
class RnnBackend:
    """How torch.autocast on `device` runs the RNN ops in `modes`: as the ATen op `aten`, lowered by that op's
    list rule; `autocast_decides`: its autocast kernel picks the dtype itself (cuDNN's float16)."""

    device: str
    aten: str
    modes: frozenset[str]
    autocast_decides: bool = False

    def aten_name(self, op: str, args: tuple) -> str | None:
        """The ATen op the `op` call (torch.lstm, torch.gru...) runs as here, None when no fused kernel takes it."""
        first = args[0] if args else None
        if op not in self.modes or not isinstance(first, Tensor) or first.numel() == 0:
            return None
        if self.device == "cpu":
            # oneDNN takes the padded overload `lstm(input, (h, c), params, ...)` (RNN.cpp's use_mkldnn); with
            # proj_size > 0 it falls back to linear/matmul cells, which torch.autocast also lowers: the same outcome
            hx = args[1] if len(args) > 1 else None
            return self.aten if isinstance(hx, (list, tuple)) and len(hx) == 2 and \
                torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled else None
        usable = torch.backends.cudnn.enabled and torch.backends.cudnn.is_available()
        return self.aten if usable and first.dtype in _CUDNN_DTYPES else None


BACKENDS = {
    "cpu": RnnBackend("cpu", "mkldnn_rnn_layer", frozenset({"lstm"})),
    "cuda": RnnBackend("cuda", "_cudnn_rnn", frozenset({"lstm", "gru", "rnn_tanh", "rnn_relu"}), autocast_decides=True),
}
RNN_MODES = frozenset().union(*(b.modes for b in BACKENDS.values()))


def rnn_aten_name(op: str, args: tuple, backend: RnnBackend | None) -> str | None:
    """The ATen op the RNN call `op(*args)` runs as: by `backend`, else by its input's device type."""
    if backend is None:
        first = args[0] if args else None
        backend = BACKENDS.get(first.device.type) if isinstance(first, Tensor) else None
    return backend.aten_name(op, args) if backend is not None else None

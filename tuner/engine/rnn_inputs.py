"""Lower-precision inputs into an FP32 `nn.RNN`/`nn.GRU`/`nn.LSTM` under mpt's Python engine.

`nn.RNNBase.forward` refuses an input whose dtype differs from its weights' unless torch.autocast is on
(`check_input`), before the op (`_VF.gru`...) that the engine decides about is even called. Under
torch.autocast that check stands down and the op runs in the precision autocast gives it; under mpt's
engine autocast is off, so a bf16 activation from a lowered layer before the RNN would end the forward.
While an engine is active, a forward pre-hook gives such an RNN its input (and hidden state) in its weights'
dtype. Widening bf16/fp16 to FP32 is exact, so the numbers are those the RNN op would see anyway, and the
engine's rule for the RNN op then decides its precision as for any other op. The hook acts only where torch
would raise (autocast off, lower-precision float input, FP32 weights); anything else is left alone.
"""
from __future__ import annotations

import threading
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

_LOWER = (torch.bfloat16, torch.float16)
_lock = threading.Lock()
_users = 0
_handle: Any = None


def acquire() -> None:
    """Install the hook (process-wide, reference counted: engines nest and run on several threads)."""
    global _users, _handle
    with _lock:
        _users += 1
        if _handle is None:
            # (torch annotates the hook as returning None; a pre-hook may return new args)
            _handle = torch.nn.modules.module.register_module_forward_pre_hook(_match_weights)  # type: ignore[arg-type]


def release() -> None:
    """Undo one `acquire`; the hook goes with the last."""
    global _users, _handle
    with _lock:
        _users = max(0, _users - 1)
        if _users == 0 and _handle is not None:
            _handle.remove()
            _handle = None


def _widen(x: Any, dtype: torch.dtype) -> Any:
    if isinstance(x, PackedSequence):
        return x._replace(data=_widen(x.data, dtype))
    if isinstance(x, Tensor):
        return x.to(dtype) if x.dtype in _LOWER else x
    if isinstance(x, tuple) and not hasattr(x, "_fields"):
        return tuple(_widen(i, dtype) for i in x)
    return x


def _match_weights(module: nn.Module, args: tuple) -> tuple | None:
    if not isinstance(module, nn.RNNBase) or not args or torch._C._is_any_autocast_enabled():
        return None
    weights = getattr(module, "_flat_weights", None)
    weight = weights[0] if weights else None
    if not isinstance(weight, Tensor) or weight.dtype != torch.float32:
        return None
    first = args[0].data if isinstance(args[0], PackedSequence) else args[0]
    if not isinstance(first, Tensor) or first.dtype not in _LOWER:
        return None
    return tuple(_widen(a, weight.dtype) for a in args)

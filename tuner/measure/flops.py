"""FLOP estimates for matmul- and conv-like ops, from tensor shapes (2 per multiply-add)."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from torch import Tensor

MATMUL_OPS = frozenset({"linear", "matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "mv", "dot",
                        "addmm", "baddbmm", "addbmm", "addmv", "einsum", "scaled_dot_product_attention",
                        "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                        "conv_transpose3d", "conv_tbc", "bilinear"})
RNN_OPS = frozenset({"lstm", "gru", "rnn_tanh", "rnn_relu", "mkldnn_rnn_layer"})


def first_tensor(x: Any) -> Tensor | None:
    """The first tensor in a (nested) tuple, list or dict; None when there is none."""
    if isinstance(x, Tensor):
        return x
    items = x.values() if isinstance(x, Mapping) else x if isinstance(x, (list, tuple)) else ()
    for item in items:
        t = first_tensor(item)
        if t is not None:
            return t
    return None


def op_flops(op: str, args: tuple, kwargs: dict, out: Any) -> int:
    """FLOPs of one call of a matmul/conv-like op or a recurrent layer; 0 for other ops (memory-bound)."""
    if op in RNN_OPS:
        return _rnn_flops(args)
    if op not in MATMUL_OPS:
        return 0
    o = first_tensor(out)
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, Tensor)]
    if o is None or not tensors:
        return 0
    try:
        if op in ("linear", "bilinear"):
            w = tensors[1] if len(tensors) > 1 else tensors[0]
            return 2 * o.numel() * int(w.shape[-1])
        if op in ("addmm", "baddbmm", "addbmm", "addmv"):
            a = tensors[1]
            return 2 * o.numel() * int(a.shape[-1]) * (int(a.shape[0]) if op == "addbmm" else 1)
        if op in ("matmul", "__matmul__", "mm", "bmm", "mv", "dot"):
            return 2 * o.numel() * int(tensors[0].shape[-1]) if tensors[0].dim() > 0 else 0
        if op == "__rmatmul__":
            return 2 * o.numel() * int(tensors[1].shape[-1]) if len(tensors) > 1 else 0
        if op.startswith("conv_transpose"):
            x, w = tensors[0], tensors[1]
            return 2 * x.numel() * int(w.shape[1]) * math.prod(int(s) for s in w.shape[2:])
        if op.startswith("conv"):
            w = tensors[1]
            return 2 * o.numel() * math.prod(int(s) for s in w.shape[1:])
        if op == "scaled_dot_product_attention":
            q, k = tensors[0], tensors[1]
            return 4 * math.prod(int(s) for s in q.shape[:-1]) * int(k.shape[-2]) * int(q.shape[-1])
        if op == "einsum":
            return 2 * o.numel()
    except (IndexError, RuntimeError):
        return 0
    return 0


def _rnn_flops(args: tuple) -> int:
    """torch.lstm/gru(input, hx, params, ...): every step multiplies each weight matrix once per token."""
    x = args[0] if args and isinstance(args[0], Tensor) else None
    params = next((a for a in args[1:] if isinstance(a, (list, tuple)) and a and
                   all(isinstance(p, Tensor) for p in a) and any(p.dim() == 2 for p in a)), None)
    if x is None or params is None or x.dim() < 2:
        return 0
    tokens = x.numel() // int(x.shape[-1])
    return 2 * tokens * sum(p.numel() for p in params if p.dim() == 2)

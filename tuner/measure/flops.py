"""FLOP estimates for matmul- and conv-like ops, from tensor shapes (2 per multiply-add)."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from tuner.policy.opnames import MATMUL_OPS, RNN_CELL_OPS, RNN_OPS

__all__ = ["MATMUL_OPS", "RNN_CELL_OPS", "RNN_OPS", "aten_flops", "first_tensor", "op_flops"]

_PRODUCTS = frozenset({"tensordot", "inner"})  # one contraction, no batch dimensions
_CHAINS = frozenset({"linalg_multi_dot", "chain_matmul"})

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

_CONVS = frozenset({"conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
                    "conv_tbc"})

def op_flops(op: str, args: tuple, kwargs: dict, out: Any) -> int:
    """FLOPs of one call of a matmul/conv-like op or a recurrent layer; 0 for other ops (memory-bound).

    Each count is what the ATen calls the op runs as count (`aten_flops`), so a report's share, counted here
    at the Python level, is the share the deployed model's kernels compute (issue 34)."""
    if op in RNN_CELL_OPS:
        return _cell_flops(args, kwargs)
    if op in RNN_OPS:
        return _rnn_flops(args)
    if op not in MATMUL_OPS:
        return 0
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, Tensor)]
    try:
        if op == "einsum":
            return _einsum_flops(args, kwargs)
        if op in _CHAINS:
            return _chain_flops([t for a in (*args, *kwargs.values())
                                 for t in (a if isinstance(a, (list, tuple)) else (a,)) if isinstance(t, Tensor)])
        o = first_tensor(out)
        if o is None or not tensors:
            return 0
        return _matmul_flops(op, tensors, o) if op not in _CONVS else _conv_flops(op, tensors, o)
    except (IndexError, RuntimeError, KeyError):
        return 0

def _matmul_flops(op: str, tensors: list[Tensor], o: Tensor) -> int:
    """op_flops of a matmul-like op other than einsum and the chains: `tensors` its tensor arguments in order,
    `o` its output."""
    if op == "linear":
        return 2 * o.numel() * int(tensors[1].shape[-1] if len(tensors) > 1 else tensors[0].shape[-1])
    if op == "bilinear":  # bilinear(x1, x2, weight[out, in1, in2]): ATen's _trilinear, in1 * in2 per output
        return 2 * o.numel() * math.prod(int(s) for s in tensors[2].shape[1:])
    if op in ("addmm", "baddbmm", "addbmm", "addmv"):
        a = tensors[1]
        return 2 * o.numel() * int(a.shape[-1]) * (int(a.shape[0]) if op == "addbmm" else 1)
    if op in ("matmul", "linalg_matmul", "__matmul__", "mm", "bmm", "mv", "dot"):
        return 2 * o.numel() * int(tensors[0].shape[-1]) if tensors[0].dim() > 0 else 0
    if op == "__rmatmul__":
        return 2 * o.numel() * int(tensors[1].shape[-1]) if len(tensors) > 1 else 0
    if op in _PRODUCTS:  # (m x k) by (k x n) as one mm (or dot): k is sqrt(|a| |b| / |out|)
        a, b = tensors[0], tensors[1]
        if a.dim() == 0 or b.dim() == 0 or o.numel() == 0:
            return 0
        return 2 * o.numel() * math.isqrt(a.numel() * b.numel() // o.numel())
    if op in ("_grouped_mm", "grouped_mm"):
        return grouped_mm_flops(tensors[0], tensors[1], o)
    if op == "scaled_dot_product_attention":
        q, k = tensors[0], tensors[1]
        return 4 * math.prod(int(s) for s in q.shape[:-1]) * int(k.shape[-2]) * int(q.shape[-1])
    return 0

def grouped_mm_flops(a: Tensor, b: Tensor, o: Tensor) -> int:
    """torch._grouped_mm(a, b, offs=...): each group's rows (or columns) times its own matrix. Every output element
    of a 2-d by 3-d call (an MoE layer's experts: `a` the tokens sorted by expert, `b` one matrix per expert), a 3-d
    by 2-d or a 3-d by 3-d one sums over `a`'s last dimension; a 2-d by 2-d call (the weight gradient) splits
    that dimension among its `o.shape[0]` groups. Counted from the output's shape, the rows past `offs[-1]`
    (none in transformers' experts) included: reading `offs` would cost a device-to-host copy per call."""
    if a.dim() == 2 and b.dim() == 2:
        return 2 * (o.numel() // max(int(o.shape[0]), 1)) * int(a.shape[-1])
    return 2 * o.numel() * int(a.shape[-1])

def _conv_flops(op: str, tensors: list[Tensor], o: Tensor) -> int:
    """op_flops of a convolution: 2 per multiply-add, each output element of a (grouped) convolution taking
    one weight slice; a transposed one counted from its input, as ATen's `convolution` is."""
    x, w = tensors[0], tensors[1]
    if op == "conv_tbc":  # input (time, batch, in), weight (kernel, in, out)
        return 2 * o.numel() * int(w.shape[0]) * int(w.shape[1])
    if op.startswith("conv_transpose"):
        return 2 * x.numel() * int(w.shape[1]) * math.prod(int(s) for s in w.shape[2:])
    return 2 * o.numel() * math.prod(int(s) for s in w.shape[1:])

def _chain_flops(matrices: list[Tensor]) -> int:
    """torch.linalg.multi_dot / chain_matmul: the mm calls of the cheapest order, which torch picks (a 1-d first
    or last operand is a row or column vector); 2 per multiply-add, the usual matrix-chain cost."""
    n = len(matrices)
    if n < 2:
        return 0
    shapes = [(int(m.shape[0]), int(m.shape[1])) if m.dim() == 2 else (1, int(m.shape[0])) if i == 0
              else (int(m.shape[0]), 1) for i, m in enumerate(matrices)]
    dims = [shapes[0][0]] + [c for _, c in shapes]
    cost = [[0] * n for _ in range(n)]
    for span in range(1, n):
        for i in range(n - span):
            j = i + span
            cost[i][j] = min(cost[i][k] + cost[k + 1][j] + dims[i] * dims[k + 1] * dims[j + 1] for k in range(i, j))
    return 2 * cost[0][n - 1]

def _einsum_flops(args: tuple, kwargs: dict) -> int:
    """torch.einsum(equation, *operands): 2 per multiply-add of each pairwise contraction, left to right (as
    torch contracts them), a contraction's multiply-adds being the product of the sizes of every index in
    its two operands. The multiply-adds sum over the contracted indices: `bim,iom->bom` costs b*i*o*m of
    them, not one per output element."""
    equation = args[0] if args and isinstance(args[0], str) else kwargs.get("equation")
    rest = args[1:] if args and isinstance(args[0], str) else args
    operands = [t for t in (rest[0] if len(rest) == 1 and isinstance(rest[0], (list, tuple)) else rest)
                if isinstance(t, Tensor)]
    if not isinstance(equation, str) or not operands:
        return 0
    lhs, _, out = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if len(terms) != len(operands):
        return 0
    ell = max((t.dim() - len(term.replace("...", "")) for term, t in zip(terms, operands, strict=True)
               if "..." in term),
              default=0)
    spare = [chr(c) for c in range(0x100, 0x100 + ell)]  # one letter per broadcast dimension of `...`
    sizes: dict[str, int] = {}
    subs = []
    for term, t in zip(terms, operands, strict=True):
        if "..." in term:
            n = t.dim() - len(term.replace("...", ""))
            term = term.replace("...", "".join(spare[ell - n:]))
        if len(term) != t.dim():
            return 0
        for letter, size in zip(term, t.shape, strict=True):
            sizes[letter] = max(sizes.get(letter, 1), int(size))
        subs.append(set(term))
    if len(subs) == 1:
        return 2 * math.prod(sizes[x] for x in subs[0])
    total, acc = 0, subs[0]
    kept = set(out.replace("...", "".join(spare))) if "->" in equation else {x for x in sizes if
                                                                                  sum(x in s for s in subs) == 1}
    for i, nxt in enumerate(subs[1:], start=2):
        both = acc | nxt
        total += 2 * math.prod(sizes[x] for x in both)
        later = set().union(*subs[i:]) if i < len(subs) else set()
        acc = {x for x in both if x in kept or x in later}
    return total

def _rnn_flops(args: tuple) -> int:
    """torch.lstm/gru(input, hx, params, ...): every step multiplies each weight matrix once per token."""
    x = args[0] if args and isinstance(args[0], Tensor) else None
    params = next((a for a in args[1:] if isinstance(a, (list, tuple)) and a and
                   all(isinstance(p, Tensor) for p in a) and any(p.dim() == 2 for p in a)), None)
    if x is None or params is None or x.dim() < 2:
        return 0
    tokens = x.numel() // int(x.shape[-1])
    return 2 * tokens * sum(p.numel() for p in params if p.dim() == 2)

def _cell_flops(args: tuple, kwargs: dict) -> int:
    """torch.gru_cell/lstm_cell/rnn_*_cell(input, hx, w_ih, w_hh, ...): each input row (one, unbatched) multiplies
    both weight matrices once: the two `linear` calls ATen runs it as (addmm, or mm without biases)."""
    a = [*args[:4], *(kwargs[k] for k in ("w_ih", "w_hh") if k in kwargs)]
    x = a[0] if a and isinstance(a[0], Tensor) else None
    weights = [w for w in a[2:4] if isinstance(w, Tensor) and w.dim() == 2]
    if x is None or x.dim() == 0 or len(weights) != 2:
        return 0
    return 2 * (x.numel() // int(x.shape[-1])) * sum(int(w.numel()) for w in weights)

def aten_flops(op: str, args: tuple, kwargs: dict, out: Any) -> int:
    """FLOPs of one ATen matmul/conv/attention/RNN call (`tuner.measure.deployed.GEMMS`'s names), 0 for others.

    `op` is the overload packet's name (`aten.convolution` -> "convolution"); `args`/`kwargs` are the ATen
    call's own. The counts are `op_flops`'s for the Python-level op the call implements, so a forward counted
    at either level gives the same FLOPs where it runs the same work."""
    a = list(args) + list(kwargs.values())
    o = first_tensor(out)
    try:
        if op in ("mm", "bmm", "mv", "dot", "_int_mm", "_scaled_mm"):
            return 2 * o.numel() * int(a[0].shape[-1]) if o is not None and a[0].dim() > 0 else 0
        if op in ("addmm", "baddbmm", "addmv", "_addmm_activation"):
            return 2 * o.numel() * int(a[1].shape[-1]) if o is not None else 0
        if op == "addbmm":
            return 2 * o.numel() * int(a[1].shape[-1]) * int(a[1].shape[0]) if o is not None else 0
        if op in ("linear", "matmul"):  # on a NestedTensor only (`GEMMS`): its total size counts every sequence
            return 2 * o.numel() * int(a[0].size(-1)) if o is not None else 0
        if op in ("mkldnn_linear", "_mkldnn_linear"):
            return 2 * o.numel() * int(a[1].shape[-1]) if o is not None else 0
        if op in ("convolution", "_convolution", "convolution_overrideable"):
            x, w, transposed = a[0], a[1], bool(a[6])
            if transposed:
                return 2 * x.numel() * int(w.shape[1]) * math.prod(int(s) for s in w.shape[2:])
            return 2 * o.numel() * math.prod(int(s) for s in w.shape[1:]) if o is not None else 0
        if op == "mkldnn_convolution":
            return 2 * o.numel() * math.prod(int(s) for s in a[1].shape[1:]) if o is not None else 0
        if op == "conv_tbc":  # (input, weight[kernel, in, out], bias, pad)
            return 2 * o.numel() * int(a[1].shape[0]) * int(a[1].shape[1]) if o is not None else 0
        if op == "_trilinear":
            return _trilinear_flops(a, o)
        if op == "_grouped_mm":  # (a, b, offs, bias, out_dtype)
            return grouped_mm_flops(a[0], a[1], o) if o is not None else 0
        if op.startswith("_scaled_dot_product"):
            q, k = a[0], a[1]
            return 4 * math.prod(int(s) for s in q.shape[:-1]) * int(k.shape[-2]) * int(q.shape[-1])
        if op == "_native_multi_head_attention":
            q, k = a[0], a[1]
            e = int(a[3])
            tq, tk = q.numel() // e, k.numel() // e
            return 2 * (2 * tq + 2 * tk) * e * e + _attention_flops(q, k, e)  # q, k, v and out projections
        if op == "_transformer_encoder_layer_fwd":
            src, e = a[0], int(a[1])
            tokens = src.numel() // e
            weights = a[3].numel() + a[5].numel() + a[14].numel() + a[16].numel()
            return 2 * tokens * int(weights) + _attention_flops(src, src, e)
        if op == "mkldnn_rnn_layer":  # one layer: (input, w_ih, w_hh, ...)
            x = a[0]
            return 2 * (x.numel() // int(x.shape[-1])) * int(a[1].numel() + a[2].numel())
        if op == "_cudnn_rnn":  # every layer: (input, [weights...], ...), as `_rnn_flops` counts torch.lstm/gru
            return 2 * (a[0].numel() // int(a[0].shape[-1])) * sum(int(w.numel()) for w in a[1] if w.dim() == 2)
    except (IndexError, RuntimeError, AttributeError, TypeError):
        return 0
    return 0

def _trilinear_flops(a: list, o: Tensor | None) -> int:
    """aten._trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, ...), what F.bilinear runs as: each output
    element sums over the `sumdim` dimensions of the three inputs, each unsqueezed at its `expand` positions."""
    if o is None:
        return 0
    sizes: dict[int, int] = {}
    for t, expand in zip(a[:3], a[3:6], strict=True):
        shape = [int(s) for s in t.shape]
        for d in sorted(int(e) for e in expand):
            shape.insert(d, 1)
        for d, size in enumerate(shape):
            sizes[d] = max(sizes.get(d, 1), size)
    return 2 * o.numel() * math.prod(sizes[int(d)] for d in a[6])

def _attention_flops(q: Tensor, k: Tensor, e: int) -> int:
    """softmax(q k^T) v over all heads: 4 * (query tokens) * (key tokens) * e per sequence; nested tensors
    (the fast path's padding dropped) count each sequence at its own length."""
    if q.is_nested:
        lq = [int(s[0]) for s in q._nested_tensor_size()]
        lk = [int(s[0]) for s in k._nested_tensor_size()]
        return sum(4 * x * y * e for x, y in zip(lq, lk, strict=False))
    if q.dim() < 3:
        return 4 * (q.numel() // e) * (k.numel() // e) * e
    batch = math.prod(int(s) for s in q.shape[:-2])
    return 4 * batch * int(q.shape[-2]) * int(k.shape[-2]) * e

"""For an op whose kernel computed in another dtype than it was cast to (`Decision.kernel`): what it ran, and the
cheap change, if any, that lets it run in the dtype it was cast to, found by trying it.

torch's CPU `scaled_dot_product_attention` widens bf16/fp16 q/k/v to FP32 in its math fallback; it takes that
fallback for a q/k/v whose last dimension is not contiguous, whose key/value heads are fewer than the query's
(broadcast), or that is 3-d (no heads dimension), among others. Rather than restate torch's rules (which change
between versions and devices), each change is tried on the call's own inputs under `KernelWatch`: a contiguous
copy of every input, the key/value heads expanded to the query's, a heads dimension for 3-d inputs, and those
with a contiguous copy. `mpt inspect` prints the first that runs in the cast dtype.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

from tuner.core.dtypes import short_name
from tuner.engine.function_mode import Decision
from tuner.engine.kernels import KernelWatch


def kernel_note(d: Decision, func: Callable[..., Any], args: tuple, kwargs: dict) -> str:
    """One line for `mpt inspect` when `d`'s kernel computed in another dtype than `d.compute` ("" when not):
    what it ran, and the cheap change that lets it run in `d.compute` when one of those tried does."""
    if d.kernel is None or d.compute is None:
        return ""
    ran = (f"cast to {short_name(d.compute)}, but its kernel computed its matmuls in {short_name(d.kernel)} "
           f"(counted so)")
    for change, fix in _CHANGES:
        tried = fix(args, kwargs)
        if tried is not None and _runs_in(func, *tried) == {d.compute}:
            return f"{ran}; it runs in {short_name(d.compute)} with {change}"
    return ran


def _runs_in(func: Callable[..., Any], args: tuple, kwargs: dict) -> set[Any]:
    """The dtypes the ATen matmul kernels of `func(*args, **kwargs)` computed in (empty when it failed)."""
    watch = KernelWatch()
    try:
        with watch:
            func(*args, **kwargs)
    except Exception:  # noqa: BLE001 - a change the op refuses is no change to suggest
        return set()
    return watch.dtypes


def _contiguous(args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """Every tensor input a contiguous copy; None when they all are contiguous already."""
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, Tensor)]
    if all(t.is_contiguous() for t in tensors):
        return None
    return (tuple(a.contiguous() if isinstance(a, Tensor) else a for a in args),
            {k: v.contiguous() if isinstance(v, Tensor) else v for k, v in kwargs.items()})


def _expanded(args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """Attention's key/value (2nd and 3rd inputs) with their heads (dim -3) repeated up to the query's; None when
    they have as many heads already, or the query's are no multiple of theirs."""
    qkv = [a for a in args[:3] if isinstance(a, Tensor)]
    if len(qkv) < 3 or qkv[0].dim() < 3 or qkv[1].dim() != qkv[0].dim():
        return None
    heads, kv_heads = int(qkv[0].shape[-3]), int(qkv[1].shape[-3])
    if kv_heads >= heads or heads % kv_heads:
        return None
    k, v = (t.repeat_interleave(heads // kv_heads, dim=-3) for t in qkv[1:])
    return (qkv[0], k, v, *args[3:]), {key: val for key, val in kwargs.items() if key != "enable_gqa"}


def _with_heads(args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """Attention's 3-d q/k/v (and mask) given a heads dimension of 1 (torch's CPU fused kernel takes 4-d inputs
    only); None when they have one."""
    qkv = [a for a in args[:3] if isinstance(a, Tensor)]
    if len(qkv) < 3 or any(t.dim() != 3 for t in qkv):
        return None
    mask = kwargs.get("attn_mask")
    rest = {**kwargs, "attn_mask": mask.unsqueeze(-3)} if isinstance(mask, Tensor) and mask.dim() == 3 else kwargs
    return (*(t.unsqueeze(-3) for t in qkv), *args[3:]), rest


Change = Callable[[tuple, dict], "tuple[tuple, dict] | None"]


def _chain(*steps: Change) -> Change:
    """The changes one after the other; None when any of them has nothing to change."""
    def run(args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        tried: tuple[tuple, dict] | None = (args, kwargs)
        for step in steps:
            tried = step(*tried) if tried is not None else None
        return tried
    return run


_CONTIGUOUS = "its inputs made contiguous (.contiguous())"
_EXPANDED = "the key/value heads expanded to the query's (repeat_interleave on dim -3)"
_HEADS = "4-d q/k/v (a heads dimension: unsqueeze(1))"
_CHANGES: tuple[tuple[str, Change], ...] = (
    (_CONTIGUOUS, _contiguous),
    (_EXPANDED, _expanded),
    (_HEADS, _with_heads),
    (f"{_HEADS} and {_CONTIGUOUS}", _chain(_with_heads, _contiguous)),
    (f"{_EXPANDED} and {_CONTIGUOUS}", _chain(_expanded, _contiguous)),
)

"""Ranking op instances by how much running them in the lower precision hurts the model's output.

Two scorers, both on example inputs, both in units of relative output error
(‖Δoutput‖ / ‖output‖) so their scores compare:

- `gradient` (default): one forward pass in FP32 in which every candidate op
  also computes its lower-precision result on the same inputs (its local
  error δ), then a few backward passes of random projections vᵀ·output. Since
  E[(vᵀJδ)²] = ‖Jδ‖² for Gaussian v, each op's first-order effect on the final
  output comes out of the same pass: the damage it does downstream, not just
  its local error. Cost: about one forward plus `probes` backward passes.
- `exact`: one forward per candidate with only that op in the lower precision.
  Catches effects a first-order estimate misses (saturation, overflow), at N forwards.
Candidates whose error is non-finite (an overflow) score inf either way.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import Tensor, nn

from .audit import relative_error
from .engine import Decision, PrecisionEngine
from .flops import first_tensor
from .plan import OpInstance
from .policy import Policy

Progress = Callable[[int, int], None]


def _float_leaves(x: Any) -> list[Tensor]:
    if isinstance(x, Tensor):
        return [x] if x.is_floating_point() else []
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _float_leaves(item)]
    if isinstance(x, dict):
        return [t for item in x.values() for t in _float_leaves(item)]
    return []


def _with_grad(x: Any) -> Any:
    if isinstance(x, Tensor) and x.is_floating_point():
        return x.detach().clone().requires_grad_(True)
    if isinstance(x, (list, tuple)):
        items = [_with_grad(i) for i in x]
        return tuple(items) if isinstance(x, tuple) else items
    if isinstance(x, dict):
        return {k: _with_grad(v) for k, v in x.items()}
    return x


def _cast(x: Any, dtype: torch.dtype) -> Any:
    if isinstance(x, Tensor) and x.is_floating_point() and x.dtype != torch.float64:
        return x.detach().to(dtype)
    if isinstance(x, (list, tuple)):
        items = [_cast(i, dtype) for i in x]
        return tuple(items) if isinstance(x, tuple) else items
    return x


def rank_exact(model: nn.Module, inputs: tuple, policy: Policy, dtype: torch.dtype,
               candidates: list[OpInstance], ref_out: Any, progress: Progress | None = None,
               only: list[OpInstance] | None = None) -> dict[OpInstance, float]:
    """Final-output error with only that instance in the lower precision (one forward each)."""
    scores: dict[OpInstance, float] = {}
    all_fp32 = {c.key(): torch.float32 for c in candidates}
    todo = only if only is not None else candidates
    with torch.no_grad():
        for n, cand in enumerate(todo):
            overrides = dict(all_fp32)
            overrides[cand.key()] = dtype
            with PrecisionEngine(policy, dtype, root=model, instance_overrides=overrides):
                out = model(*inputs)
            err = relative_error(out, ref_out)
            scores[cand] = float("inf") if err is None or not math.isfinite(err) else err
            if progress:
                progress(n + 1, len(todo))
    return scores


def rank_gradient(model: nn.Module, inputs: tuple, policy: Policy, dtype: torch.dtype,
                  candidates: list[OpInstance], ref_out: Any, progress: Progress | None = None,
                  probes: int = 8, seed: int = 0) -> dict[OpInstance, float]:
    """First-order ‖J_i δ_i‖ / ‖output‖ for every candidate from one shadowed forward pass."""
    wanted = {c.key(): c for c in candidates}
    outs: dict[OpInstance, Tensor] = {}
    deltas: dict[OpInstance, Tensor] = {}
    bad: set[OpInstance] = set()

    def record(d: Decision, func: Any, args: tuple, kwargs: dict, out: Any, *raw: Any) -> None:
        cand = wanted.get((d.module, d.op, d.index))
        y = first_tensor(out)
        if cand is None or y is None or not y.is_floating_point():
            return
        with torch.no_grad():
            low = first_tensor(func(*_cast(args, dtype), **{k: _cast(v, dtype) for k, v in kwargs.items()}))
        if low is None or low.shape != y.shape:
            return
        delta = low.detach().float() - y.detach().float()
        if not torch.isfinite(delta).all():
            bad.add(cand)
            return
        deltas[cand] = delta
        if y.requires_grad:
            outs[cand] = y

    # Only floating-point parameters can carry gradients; integer ones (index tables) are left alone.
    requires = {p: p.requires_grad for p in model.parameters() if p.is_floating_point() or p.is_complex()}
    try:
        for p in requires:
            p.requires_grad_(True)
        with torch.enable_grad():
            overrides = {c.key(): torch.float32 for c in candidates}
            with PrecisionEngine(policy, dtype, root=model, instance_overrides=overrides, recorder=record):
                out = model(*_with_grad(inputs))
            finals = [t for t in _float_leaves(out) if t.requires_grad]
            norm = math.sqrt(sum(float(t.detach().double().pow(2).sum()) for t in _float_leaves(out))) or 1.0
            keys = [c for c in candidates if c in outs]
            sums = {c: 0.0 for c in keys}
            gen = torch.Generator().manual_seed(seed)
            if finals and keys:
                for r in range(probes):
                    vs = [torch.randn(t.shape, generator=gen).to(t.device, t.dtype) for t in finals]
                    grads = torch.autograd.grad(finals, [outs[c] for c in keys], grad_outputs=vs,
                                                retain_graph=r < probes - 1, allow_unused=True)
                    for c, g in zip(keys, grads):
                        if g is not None:
                            sums[c] += float((g.float() * deltas[c]).sum()) ** 2
                    if progress:
                        progress(r + 1, probes)
    finally:
        for p, flag in requires.items():
            p.requires_grad_(flag)
    scores = {c: math.sqrt(s / probes) / norm for c, s in sums.items()}
    for c in bad:
        scores[c] = float("inf")
    # Ops the backward pass cannot see (no gradient path) get the exact score.
    missing = [c for c in candidates if c not in scores]
    if missing:
        scores.update(rank_exact(model, inputs, policy, dtype, candidates, ref_out, only=missing))
    return scores

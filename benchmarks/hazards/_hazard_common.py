"""Shared code of the hazard model files (benchmarks/hazard_zoo.py): seeding and the metrics against FP32.

Not a model file (the leading underscore): mpt puts a model file's folder on sys.path while it imports it, so
the hazard files import this as `_hazard_common` (not `_shared`: the zoo's helper module has that name, and one process may import both). Each hazard file is a plain mpt model file (build_model, evaluate,
example_inputs) plus the settings the harness tunes it with: `TUNE` (tuner.tune's keywords: dtype, tolerance,
absolute, lower_is_better) and `SPLIT` ("design" or "heldout", see hazard_zoo.py).

Every metric compares the model under test with the outputs of a second model from the same build_model(),
run once in FP32 (no autocast, no plan) on fixed data built in the file: a model mpt hands evaluate may run
under a precision plan, so it cannot be its own reference.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, seed: int, scale: float = 1.0) -> Tensor:
    return scale * torch.randn(*shape, generator=generator(seed))


def init(model: nn.Module, seed: int) -> nn.Module:
    """Deterministic weights (normal / sqrt(fan_in), zero biases, unit norm scales), whatever torch's default
    init does."""
    g = generator(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g) / (p.shape[-1] ** 0.5))
            else:
                p.fill_(0.0 if name.endswith("bias") else 1.0)
    return model.eval()


def _first(out: Any) -> Tensor:
    return out if isinstance(out, Tensor) else out[0]


def metric(build: Callable[[], nn.Module], data: tuple, kind: str) -> Callable[[nn.Module], float]:
    """evaluate(model): `kind` of the model's output on `data` against FP32's.

    cosine: mean per-sample cosine similarity (1 = FP32); agreement: the share of samples whose top-1 class
    (argmax of the last dim) is FP32's (a discrete metric: it moves in steps of 1/len); rel-mae: mean absolute
    error over FP32's mean absolute value (lower is better, 0 = FP32). A non-finite output gives NaN/inf/0,
    which mpt counts as a failing trial.
    """
    ref_holder: list[Tensor] = []

    def evaluate(model: nn.Module) -> float:
        if not ref_holder:
            with torch.no_grad():
                ref_holder.append(_first(build()(*data)).float().detach())
        ref = ref_holder[0]
        with torch.no_grad():
            out = _first(model(*data)).float()
        if kind == "cosine":
            return float(nn.functional.cosine_similarity(out.flatten(1), ref.flatten(1), dim=1).mean())
        if kind == "agreement":
            return float((out.argmax(-1) == ref.argmax(-1)).float().mean())
        if kind == "rel-mae":
            return float((out - ref).abs().mean() / ref.abs().mean())
        raise ValueError(kind)

    return evaluate

"""Planted models for tests and benchmarks: a known set of op instances that must stay FP32.

`PlantedChain(n, fragile)` has `n` linear op instances in a chain (plus the
head); the ones in `fragile` add a large constant to a small signal before a
`cdist` (an FP32-list op on CPU). In bf16 their output rounds to a spacing
larger than the signal, so the local error of the op looks like any other
bf16 linear's (about 0.2% of its output) while the damage shows downstream,
where cdist compares near-equal points. Only those instances must be FP32.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


class PlantedChain(nn.Module):
    def __init__(self, n: int, fragile: set[int] | frozenset[int], dim: int = 16, classes: int = 8,
                 seed: int = 0) -> None:
        super().__init__()
        if n < 2:
            raise ValueError("n must be >= 2")
        g = torch.Generator().manual_seed(seed)
        self.fragile = frozenset(fragile)
        self.n_chain = n - len(self.fragile) - 1  # benign linears in the main chain (head excluded)
        if self.n_chain < 1:
            raise ValueError("too many fragile ops for n")
        self.chain = nn.ModuleList()
        for _ in range(self.n_chain):
            q, _r = torch.linalg.qr(torch.randn(dim, dim, generator=g))
            lin = nn.Linear(dim, dim, bias=False)
            with torch.no_grad():
                lin.weight.copy_(q)
            self.chain.append(lin)
        # Branch j taps the chain after layer tap[j]; each is one fragile linear.
        self.taps = sorted(int(t) for t in torch.randperm(self.n_chain, generator=g)[: len(self.fragile)].tolist())
        self.branches = nn.ModuleList()
        self.protos = nn.ParameterList()
        for _ in self.fragile:
            lin = nn.Linear(dim, dim)
            with torch.no_grad():
                lin.weight.copy_(torch.randn(dim, dim, generator=g) * (0.05 / math.sqrt(dim)))
                lin.bias.fill_(64.0)  # bf16 spacing at 64 is 0.5, the signal is ~0.05
            self.branches.append(lin)
            self.protos.append(nn.Parameter(64.0 + 0.05 * torch.randn(classes, dim, generator=g),
                                            requires_grad=False))
        self.head = nn.Linear(dim, classes)
        with torch.no_grad():
            self.head.weight.copy_(0.01 * torch.randn(classes, dim, generator=g))
            self.head.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = None
        b = 0
        y = x
        for i, lin in enumerate(self.chain):
            y = lin(y)
            while b < len(self.taps) and self.taps[b] == i:
                d = -torch.cdist(self.branches[b](y), self.protos[b], compute_mode="donot_use_mm_for_euclid_dist")
                logits = d if logits is None else logits + d
                b += 1
        head = self.head(y)
        return head if logits is None else logits * 20.0 + head

    def fragile_labels(self) -> set[str]:
        """Instance labels (module:op#index) of the planted fragile ops."""
        return {f"branches.{j}:linear#0" for j in range(len(self.fragile))}


@dataclass
class PlantedTask:
    """A planted model with an evaluation: agreement with the FP32 model's predictions.

    Its plan leaves no doubt on any CPU (issue 47): with the planted ops FP32, the other ops' bf16 rounding moves
    no kept sample's top-1 by more than a fifth of its margin (measured on the tests' tasks, up to PlantedTask(48,
    3, seed=3)), so agreement is exactly 1.0; with any one planted op in bf16 it is 0.66 or less, against the
    target 0.99 of a 1% tolerance. Kernels that differ (AMX, AVX512-BF16, AVX2) differ far less than either.
    """

    n: int
    k: int
    seed: int = 0
    samples: int = 512
    batch: int | None = None  # evaluate in batches of this size, as a DataLoader loop does; None: one batch

    def __post_init__(self) -> None:
        g = torch.Generator().manual_seed(self.seed + 1000)
        self.x = torch.randn(self.samples, 16, generator=g)
        with torch.no_grad():
            logits = self.build()(self.x)
        # Keep samples with a clear FP32 decision, so ordinary bf16 noise does not flip them.
        top2 = logits.topk(2, dim=-1).values
        keep = (top2[:, 0] - top2[:, 1]) > 0.1 * logits.std()
        self.x, self.labels = self.x[keep], logits.argmax(-1)[keep]
        self.evaluations = 0

    def build(self) -> PlantedChain:
        return PlantedChain(self.n, frozenset(range(self.k)), seed=self.seed).eval()

    def evaluate(self, model: nn.Module) -> float:
        self.evaluations += 1
        step = self.batch or len(self.x)
        with torch.no_grad():
            preds = torch.cat([model(self.x[i:i + step]).argmax(-1) for i in range(0, len(self.x), step)])
        return float((preds == self.labels).float().mean())

    def example_inputs(self) -> tuple:
        return (self.x[:32],)

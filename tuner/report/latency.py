"""The tuned model's forward time against FP32's, measured on one model with the plan attached and detached."""
from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tuner.core.inputs import ModelInputs
from tuner.engine.attach import attach, detach
from tuner.policy.plan import Plan

MIN_NOISE = 0.05  # a tuned forward this much slower than FP32 (relative) may still be noise


@dataclass(frozen=True)
class Latency:
    """Median milliseconds per forward in FP32 and tuned, and each side's spread (IQR over the median)."""

    fp32: float
    tuned: float
    speedup: float | None  # fp32 / tuned
    fp32_spread: float
    tuned_spread: float
    rounds: int

    def __post_init__(self) -> None:
        if min(self.fp32, self.tuned, self.fp32_spread, self.tuned_spread) < 0 or self.rounds < 1:
            raise ValueError(f"latency: times and spreads must be >= 0 and rounds >= 1, found {self}")

    @property
    def noise(self) -> float:
        """How much slower the tuned side may be and still count as equal: the larger spread, at least 5%."""
        return max(MIN_NOISE, self.fp32_spread, self.tuned_spread)

    @property
    def slower(self) -> bool:
        """The tuned model ran slower than FP32 by more than the noise."""
        return self.tuned > self.fp32 * (1 + self.noise)

    def text(self) -> str:
        """`1.23 ms vs 2.34 ms FP32`, as the summary and report.md write it."""
        return f"{self.tuned:.2f} ms vs {self.fp32:.2f} ms FP32"

    def to_dict(self) -> dict[str, Any]:
        """report.json's `latency_ms`: the numbers, how the rounds ran and that tuned weights are cast per call."""
        return {"fp32": self.fp32, "tuned": self.tuned, "speedup": self.speedup, "fp32_spread": self.fp32_spread,
                "tuned_spread": self.tuned_spread, "rounds": self.rounds, "order": "interleaved",
                "tuned_weights": "cast per call"}


def compare_latency(model: nn.Module, plan: Plan, inputs: ModelInputs | tuple, *, device: str = "cpu",
                    min_time: float = 0.6, min_rounds: int = 3, max_rounds: int = 100) -> Latency:
    """Milliseconds per forward of `model` in FP32 and with `plan` attached (`tuner.attach`, as `tuner.load`).

    One model, no copy: each round times one FP32 call and then one call with
    the plan attached (detached again in a finally), so drifts in clock speed
    or load hit both alike; one warm-up call of each comes first. Rounds go on
    until `min_time` seconds have passed and at least `min_rounds` ran. Returns
    the medians, the speedup (fp32 / tuned) and each side's spread, the
    interquartile range over the median. The attached model casts its FP32
    weights on every call, where the loaded checkpoint already stores them
    lowered: `tuned` errs on the slow side (report.json: `tuned_weights: "cast per call"`).
    """
    inputs = ModelInputs.of(inputs)
    plain = dataclasses.replace(plan, model=None)  # the same model: no structure check per round
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else None

    def timed() -> float:
        t0 = time.perf_counter()
        inputs.call(model)
        if sync is not None:
            sync()
        return time.perf_counter() - t0

    def tuned() -> float:
        attach(model, plain)
        try:
            return timed()
        finally:
            detach(model)

    fp32_s: list[float] = []
    tuned_s: list[float] = []
    with torch.no_grad():
        timed()  # warm-up of each
        tuned()
        start = time.perf_counter()
        while len(fp32_s) < min_rounds or (time.perf_counter() - start < min_time and len(fp32_s) < max_rounds):
            fp32_s.append(timed())
            tuned_s.append(tuned())
    fp32_ms, tuned_ms = statistics.median(fp32_s) * 1e3, statistics.median(tuned_s) * 1e3
    return Latency(fp32=fp32_ms, tuned=tuned_ms, speedup=fp32_ms / tuned_ms if tuned_ms else None,
                   fp32_spread=_spread(fp32_s), tuned_spread=_spread(tuned_s), rounds=len(fp32_s))


def _spread(samples: list[float]) -> float:
    """(p75 - p25) / median: the timing noise, relative."""
    if len(samples) < 2:
        return 0.0
    q1, median, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return (q3 - q1) / median if median else 0.0

"""The tuned model's forward time against FP32's, measured on one model with the plan attached and detached,
and judged: a speedup is stated only when the timing is tight enough and clear of 1.0.

`compare_latency` times rounds of one FP32 call and one tuned call with the
thread count pinned; `judge` turns the samples into a `Latency` (pure, so the
decision rule is tested on synthetic samples). The rule: the per-round ratios
fp32 / tuned give a distribution-free ~95% interval of the median speedup
(order statistics); when that interval is wider than `BOUND` (hi / lo above
1 + BOUND) the result is "too noisy to judge" and no figure is printed; when
it reaches within `MIN_EFFECT` of 1.0 the result is "no measurable
difference"; otherwise the tuned model is faster or slower. The
slower-than-FP32 warning is given on the verdict `slower` only.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tuner.core.inputs import ModelInputs
from tuner.engine.attach import attach, detach
from tuner.policy.plan import Plan

BOUND = 0.10  # the speedup's interval may span at most 10% (hi / lo <= 1.10) for a figure to be stated
MIN_EFFECT = 0.02  # a speedup within 2% of 1.0 is no measurable difference, however tight its interval
Z95 = 1.96  # the interval of the median: order statistics n/2 -+ Z95 * sqrt(n) / 2

FASTER, SLOWER, SAME, NOISY = "faster", "slower", "no measurable difference", "too noisy to judge"


@dataclass(frozen=True)
class Latency:
    """Median milliseconds per forward in FP32 and tuned, each side's spread (IQR over the median), the
    speedup's ~95% interval from the paired rounds, and the verdict the module docstring's rule gives."""

    fp32: float
    tuned: float
    speedup: float | None  # fp32 / tuned (medians)
    fp32_spread: float
    tuned_spread: float
    rounds: int
    speedup_low: float | None = None  # the interval of the median per-round fp32 / tuned
    speedup_high: float | None = None
    threads: int = 1  # torch threads, the same for both sides
    bound: float = BOUND
    seconds: float = 0.0  # how long the timed rounds took

    def __post_init__(self) -> None:
        if min(self.fp32, self.tuned, self.fp32_spread, self.tuned_spread) < 0 or self.rounds < 1:
            raise ValueError(f"latency: times and spreads must be >= 0 and rounds >= 1, found {self}")

    @property
    def spread(self) -> float | None:
        """How wide the speedup's interval is, relative: hi / lo - 1 (None when there is none)."""
        lo, hi = self.speedup_low, self.speedup_high
        if lo is None or hi is None or lo <= 0:
            return None
        return hi / lo - 1

    @property
    def verdict(self) -> str:
        """FASTER, SLOWER, SAME (the interval reaches within MIN_EFFECT of 1.0) or NOISY (wider than `bound`)."""
        spread = self.spread
        if spread is None or spread > self.bound:
            return NOISY
        assert self.speedup_low is not None and self.speedup_high is not None
        if self.speedup_low > 1 + MIN_EFFECT:
            return FASTER
        if self.speedup_high < 1 / (1 + MIN_EFFECT):
            return SLOWER
        return SAME

    @property
    def judged(self) -> bool:
        """The timing is tight enough to state a figure."""
        return self.verdict != NOISY

    @property
    def slower(self) -> bool:
        """The tuned model measurably ran slower than FP32 (the slower-than-FP32 warning)."""
        return self.verdict == SLOWER

    def text(self) -> str:
        """As the summary and report.md write it: `1.23 ms vs 2.34 ms FP32 (1.90x faster)`,
        `... (no measurable difference)`, or `too noisy to judge (...)` with no figure."""
        verdict = self.verdict
        if verdict == NOISY:
            if self.spread is None:
                return f"too noisy to judge (no interval for the speedup after {self.rounds} rounds)"
            # a factor, not a percentage: a stalling side's interval spans 133x, which `13198%` hid
            return (f"too noisy to judge (the speedup is known only within a factor of {1 + self.spread:.3g}, "
                    f"more than the {1 + self.bound:.3g} allowed, after {self.rounds} rounds)")
        times = f"{self.tuned:.2f} ms vs {self.fp32:.2f} ms FP32"
        if verdict == SAME or not self.speedup:
            return f"{times} ({SAME})"
        factor = self.speedup if verdict == FASTER else 1 / self.speedup
        return f"{times} ({factor:.2f}x {verdict})"

    def to_dict(self) -> dict[str, Any]:
        """report.json's `latency_ms`: the numbers, the verdict, how the rounds ran and that tuned weights
        are cast per call."""
        return {"fp32": self.fp32, "tuned": self.tuned, "speedup": self.speedup, "fp32_spread": self.fp32_spread,
                "tuned_spread": self.tuned_spread, "rounds": self.rounds, "order": "interleaved",
                "tuned_weights": "cast per call", "speedup_low": self.speedup_low,
                "speedup_high": self.speedup_high, "speedup_spread": self.spread, "bound": self.bound,
                "verdict": self.verdict, "threads": self.threads, "seconds": self.seconds}


def judge(fp32_s: Sequence[float], tuned_s: Sequence[float], *, threads: int = 1, bound: float = BOUND,
          seconds: float = 0.0) -> Latency:
    """The Latency of paired rounds: `fp32_s[i]` and `tuned_s[i]` are round i's seconds per forward."""
    if not fp32_s or len(fp32_s) != len(tuned_s):
        raise ValueError(f"latency: need paired rounds, found {len(fp32_s)} FP32 and {len(tuned_s)} tuned")
    fp32_ms, tuned_ms = statistics.median(fp32_s) * 1e3, statistics.median(tuned_s) * 1e3
    low, high = _median_interval([f / t for f, t in zip(fp32_s, tuned_s, strict=True) if t > 0])
    return Latency(fp32=fp32_ms, tuned=tuned_ms, speedup=fp32_ms / tuned_ms if tuned_ms else None,
                   fp32_spread=_spread(fp32_s), tuned_spread=_spread(tuned_s), rounds=len(fp32_s),
                   speedup_low=low, speedup_high=high, threads=threads, bound=bound, seconds=seconds)


class TooSlowToTime(Exception):
    """One forward takes too long for the rounds a verdict needs to fit the timing budget."""

    def __init__(self, forward_s: float, budget_s: float, side: str = "FP32") -> None:
        super().__init__(f"one {side} forward on the example inputs takes {forward_s:.2f} s, so the {MIN_FORWARDS} "
                         f"forwards a verdict needs would take longer than the {budget_s:.1f} s budget")
        self.forward_s, self.budget_s = forward_s, budget_s


MIN_FORWARDS = 8  # the warm-up of each side and 3 rounds of both: fewer cannot give a verdict
MIN_ROUNDS = MIN_FORWARDS // 2 - 1  # the rounds a budget stops at, at the least


def compare_latency(model: nn.Module, plan: Plan, inputs: ModelInputs | tuple, *, device: str = "cpu",
                    min_time: float = 0.6, max_time: float = 3.0, min_rounds: int = 5, max_rounds: int = 100_000,
                    bound: float = BOUND, budget: float | None = None,
                    decide: Callable[[bool], bool] | None = None) -> Latency:
    """Milliseconds per forward of `model` in FP32 and with `plan` attached (`tuner.attach`, as `tuner.load`).

    One model, no copy: each round times one FP32 call and then one call with
    the plan attached (detached again in a finally), so drifts in clock speed
    or load hit both alike; one warm-up call of each comes first. Both sides
    run with `torch.get_num_threads()` threads as found at the start, set
    again before each call should the model change it. Rounds go on for at
    least `min_time` seconds and `min_rounds`, then until the speedup's
    interval is within `bound` or `max_time` seconds have passed (or
    `max_rounds`); `judge` gives the verdict. `budget` (seconds) replaces `max_time` and holds for the whole
    timing, warm-ups included: TooSlowToTime after the FP32 warm-up when MIN_FORWARDS FP32 forwards would not
    fit (a large model, whose timing would cost a sizeable share of the tune), or after the tuned warm-up when
    MIN_FORWARDS / 2 pairs would not (a tuned side far slower, as bf16 is on a CPU without bf16 kernels); no
    round starts that would end past it, and at least MIN_ROUNDS rounds run. The attached model casts its
    FP32 weights on every call, where the loaded checkpoint already stores
    them lowered: `tuned` errs on the slow side (report.json: `tuned_weights: "cast per call"`).
    `decide` makes every stop decision the same on every rank of a sharded model (whose forwards are collective:
    a rank that stopped timing alone would leave the others waiting): rank 0's, broadcast.
    """
    decide = decide or (lambda stop: stop)
    inputs = ModelInputs.of(inputs)
    max_time = max_time if budget is None else budget
    plain = dataclasses.replace(plan, model=None)  # the same model: no structure check per round
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else None
    threads = torch.get_num_threads()

    def timed() -> float:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
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
    try:
        with torch.no_grad():
            warm = timed()  # warm-up of each
            if decide(budget is not None and warm * MIN_FORWARDS > budget):
                raise TooSlowToTime(warm, budget or 0.0)
            tuned_warm = tuned()  # may be far slower than FP32 (bf16 without bf16 kernels)
            pair = warm + tuned_warm
            if decide(budget is not None and pair * MIN_FORWARDS / 2 > budget):
                raise TooSlowToTime(tuned_warm, budget or 0.0, side="tuned")
            start = time.perf_counter()
            floor = min_rounds if budget is None else min(min_rounds, MIN_ROUNDS)
            check = min_rounds  # the interval is looked at after 20% more rounds each time: no O(n^2) sorting
            stop = max_rounds < 1
            while not stop:
                fp32_s.append(timed())
                tuned_s.append(tuned())
                elapsed = time.perf_counter() - start
                # with a budget, no round starts that would end past it (the warm-ups count)
                over = elapsed >= max_time if budget is None else pair + elapsed + fp32_s[-1] + tuned_s[-1] > budget
                stop = len(fp32_s) >= max_rounds or (len(fp32_s) >= floor and over)
                if not stop and len(fp32_s) >= check and elapsed >= min_time:
                    stop = judge(fp32_s, tuned_s, bound=bound).judged
                    check = check if stop else max(check + 1, int(len(fp32_s) * 1.2))
                stop = decide(stop)
    finally:
        torch.set_num_threads(threads)
    return judge(fp32_s, tuned_s, threads=threads, bound=bound, seconds=time.perf_counter() - start)


def _median_interval(ratios: Sequence[float]) -> tuple[float | None, float | None]:
    """A distribution-free ~95% interval of the median of `ratios`: order statistics around the middle."""
    n = len(ratios)
    if n == 0:
        return None, None
    s = sorted(ratios)
    half = Z95 * math.sqrt(n) / 2
    return s[max(0, math.floor(n / 2 - half))], s[min(n - 1, math.ceil(n / 2 + half) - 1)]


def _spread(samples: Sequence[float]) -> float:
    """(p75 - p25) / median: the timing noise, relative."""
    if len(samples) < 2:
        return 0.0
    q1, median, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return (q3 - q1) / median if median else 0.0

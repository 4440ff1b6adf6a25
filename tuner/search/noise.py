"""Noisy metrics: measure how much `evaluate` varies on the same model, and judge plans against that.

The FP32 baseline is evaluated once. When the next evaluation (the all-low
trial) fed the model the same data and drew nothing new at random, evaluate is
deterministic and that one run is the baseline (`settled`: tuner.search.repeatable).
Else it is evaluated again: equal results mean a deterministic evaluate (spread 0);
different results mean noise, and the baseline is evaluated up to
`NOISY_SAMPLES` times, the baseline is their mean and the spread their range
(max - min).

Two rules share that spread:
- `Acceptance.confirms` (tune): a trial counts as passing only when its metric
  clears the target by more than the spread, so a plan accepted on a lucky
  draw is unlikely;
- `Acceptance.holds` (check): a plan fails only when its metric misses the
  target by more than the spread, so a noise-sized dip is not a regression.
With no noise both reduce to `metric >= target` (or `<=` for a loss).
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

NOISY_SAMPLES = 5


@dataclass(frozen=True)
class Baseline:
    samples: tuple[float, ...]
    settled: bool = False  # one run is enough: another evaluation showed evaluate deterministic

    def __post_init__(self) -> None:
        if not self.samples:
            raise ValueError("a baseline needs at least one sample")
        if self.settled and len(self.samples) != 1:
            raise ValueError(f"only a one-run baseline is settled by another evaluation, not {len(self.samples)}")

    @property
    def value(self) -> float:
        return self.samples[0] if self.spread == 0 else statistics.fmean(self.samples)

    @property
    def spread(self) -> float:
        return max(self.samples) - min(self.samples)

    @property
    def noisy(self) -> bool:
        return self.spread > 0

    @property
    def complete(self) -> bool:
        """Enough samples: `settled`, two equal ones, or NOISY_SAMPLES when they differ."""
        if self.settled:
            return True
        if len(self.samples) < 2:
            return False
        return not self.noisy or len(self.samples) >= NOISY_SAMPLES


def measure_baseline(run: Callable[[], float], samples: tuple[float, ...] = ()) -> Baseline:
    """Evaluate until the baseline is `complete`, starting from samples already known (a journal)."""
    base = Baseline(tuple(samples) or (run(),))
    while not base.complete:
        base = Baseline(base.samples + (run(),))
    return base


@dataclass(frozen=True)
class Acceptance:
    """The target and the noise margin around it."""

    target: float
    margin: float = 0.0
    lower_is_better: bool = False

    def _clearance(self, metric: float) -> float:
        return self.target - metric if self.lower_is_better else metric - self.target

    def confirms(self, metric: float | None) -> bool:
        if metric is None or not math.isfinite(metric):
            return False
        clearance = self._clearance(metric)
        return clearance > self.margin if self.margin > 0 else clearance >= 0

    def holds(self, metric: float | None) -> bool:
        if metric is None or not math.isfinite(metric):
            return False
        return self._clearance(metric) >= -self.margin


COARSE_STEPS = 4.0  # a tolerance of fewer metric steps than this leaves a plan's fate to a few samples


def metric_step(values: list[float]) -> float | None:
    """The step a discrete metric moves in (accuracy over M samples: 1/M), from the values measured so far;
    None when they are too few (under 3 distinct) or not whole multiples of one step."""
    distinct = sorted({round(v, 12) for v in values if math.isfinite(v)})
    if len(distinct) < 3:
        return None
    gaps = [b - a for a, b in zip(distinct, distinct[1:], strict=False)]
    step = min(gaps)
    if step <= 0:
        return None
    wiggle = max(1e-6 * max(abs(v) for v in distinct), 1e-3 * step)  # float32 metrics round their steps
    whole = all(abs(g / step - round(g / step)) * step <= wiggle for g in gaps)
    return step if whole else None


def coarse_metric_note(values: list[float], allowed: float, known: float | None = None, *,
                       training: bool = False) -> str | None:
    """A note when the tolerance spans only a few steps of a discrete metric: which plans pass is then
    decided by a handful of samples flipping, a result that may not hold on other data. The step is `known`
    when the metric says it (a built-in agreement over N positions: 1/N), however few evaluations ran; else it
    is found in the values measured. `training`: the remedy is not a built-in metric (those train nothing) but
    evaluate's own continuous one, more data, or several training runs per trial (--seeds)."""
    step = known if known is not None and known > 0 else metric_step(values)
    if step is None or allowed <= 0 or allowed / step >= COARSE_STEPS:
        return None
    remedy = ("evaluate returning a continuous metric (the held-out loss, with --lower-is-better), more "
              "evaluation data, or training each trial with several seeds (--seeds N)" if training else
              "a continuous metric (--metric cosine or kl) or more evaluation data")
    return (f"evaluate's metric moves in steps of {step:.3g} and the tolerance allows {allowed / step:.1f} of "
            "them: whether a plan passes is decided by a few samples changing their answer, so the plan may "
            f"not hold on other data; {remedy} gives a steadier answer")

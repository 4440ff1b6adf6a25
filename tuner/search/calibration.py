"""How a plan's error on the example inputs turns into a metric drop: drop = a·error^p, fitted to the trials.

The search knows two kinds of error for an FP32 set: the *predicted* residual of a prefix of its order (the
quadrature sum of the scores left in the lower precision, from the ranking) and, where a cheap forward
measured it, the *observed* relative error of the plan's output against FP32's on the example inputs
(`tuner.search.guide`). Both are on the same scale (a relative output error), so one fit serves both: each
full evaluation adds a point (error, measured drop), and the fit places the next probe where the drop is
predicted to reach a chosen share of what the tolerance allows.
"""
from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

AIM = 0.7  # extrapolating: place a probe where the predicted drop is this share of the allowed drop
THRESHOLD = 0.98  # interpolating between a failing and a passing probe: aim just inside the target
DEFAULT_P = 1.5  # drop ~ error^p: ~1 for agreement/accuracy metrics, ~2 for cosine and KL; until measured
P_RANGE = (0.5, 3.0)


def finite(x: float) -> float:
    """A score or error as a finite non-negative number (inf, an overflow, becomes 1e30)."""
    return 1e30 if not math.isfinite(x) else max(x, 0.0)


def _clamp_p(p: float) -> float:
    return min(P_RANGE[1], max(P_RANGE[0], p))


class ErrorModel:
    """The error of each prefix of the search order, and the fit that turns errors into drops.

    `residual[k]` is the error with the first k items in FP32: the quadrature sum of the scores left low, or
    the observed output errors (`use_observed`), made non-increasing in k. `points` keeps the measured drop of
    each prefix probed, `others` the (error, drop) of probes that are not prefixes (lowering units back).
    """

    def __init__(self, ordered_scores: Sequence[float]) -> None:
        squares = [min(finite(s), 1e15) ** 2 for s in ordered_scores]
        suffix = [0.0] * (len(squares) + 1)
        for i in range(len(squares) - 1, -1, -1):
            suffix[i] = suffix[i + 1] + squares[i]
        self.residual = [math.sqrt(v) for v in suffix]
        self.points: dict[int, float] = {}  # prefix length -> measured drop
        self.others: list[tuple[float, float]] = []

    def use_observed(self, errors: Sequence[float]) -> None:
        """Replace the predicted residuals by observed output errors (one per prefix length)."""
        envelope, low = [], math.inf
        for e in errors:
            low = min(low, finite(e))
            envelope.append(low)
        self.residual = envelope

    def observe(self, k: int, drop: float | None) -> None:
        if _usable(drop) and self.residual[k] > 0:
            self.points[k] = drop  # type: ignore[assignment]

    def observe_error(self, error: float, drop: float | None) -> None:
        if _usable(drop) and 0 < error < 1e29:
            self.others.append((error, drop))  # type: ignore[arg-type]

    def guess(self, lo: int, hi: int) -> int | None:
        """The prefix length the fit predicts for the target; None without data.

        Between two measured ends of the bracket: interpolate (log drop against log residual) to the target
        itself. From one side only: extrapolate, aiming at AIM of the allowed drop so the probe lands on the
        passing side.
        """
        a, b = self.points.get(lo), self.points.get(hi)
        if a is not None and b is not None and self.residual[lo] > self.residual[hi] * 1.0001:
            p = math.log(a / b) / math.log(self.residual[lo] / self.residual[hi]) if a != b else 1.0
            ref, aim = (self.residual[hi], b), THRESHOLD
        elif self.points:
            k = min(self.points, key=lambda k: abs(math.log(self.points[k] / AIM)))
            ref, p, aim = (self.residual[k], self.points[k]), self.exponent(), AIM
        else:
            return None
        wanted = ref[0] * (aim / ref[1]) ** (1.0 / _clamp_p(p))
        neg = [-r for r in self.residual]  # residual is non-increasing in k
        return bisect.bisect_left(neg, -wanted)

    def all_points(self) -> list[tuple[float, float]]:
        return [(self.residual[k], d) for k, d in self.points.items()] + self.others

    def exponent(self) -> float:
        """drop ~ error^p, least squares in log-log over every measured point; DEFAULT_P until two differ."""
        pts = [(math.log(e), math.log(d)) for e, d in self.all_points() if 0 < e < 1e29]
        if len(pts) < 2:
            return DEFAULT_P
        mx = sum(x for x, _ in pts) / len(pts)
        my = sum(y for _, y in pts) / len(pts)
        sxx = sum((x - mx) ** 2 for x, _ in pts)
        if sxx < 1e-8:
            return DEFAULT_P
        return _clamp_p(sum((x - mx) * (y - my) for x, y in pts) / sxx)

    def predicted_drop(self, error: float) -> float | None:
        """The drop the fit predicts for a plan whose output error is `error`, anchored at the measured point
        nearest in error; None without a measured point; inf for an overflow."""
        if not math.isfinite(error) or error >= 1e29:
            return math.inf
        pts = [(e, d) for e, d in self.all_points() if 0 < e < 1e29]
        if not pts:
            return None
        if error <= 0:
            return 0.0
        e0, d0 = min(pts, key=lambda pt: abs(math.log(pt[0] / error)))
        return d0 * (error / e0) ** self.exponent()


def _usable(drop: float | None) -> bool:
    return drop is not None and math.isfinite(drop) and drop > 0

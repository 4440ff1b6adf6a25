"""Cheap forwards that guide the search: the output error of a candidate plan on the example inputs.

A full evaluation runs the user's `evaluate`; a forward of the model as a trial would run it, on the example
inputs, costs a fraction of that and says how far the plan's output moves from FP32's (`predict`, a relative
error; inf when the output overflows). PrecisionSearch uses it three ways (issue 18):
- the order: the error left by each prefix of the ranking's order is observed, not inferred from linearized
  scores; when those errors do not fall as the ranking says (a ranking that does not predict), the order is
  rebuilt from each unit's own observed effect (`observed_order`);
- the probes: a prefix whose error equals a failed probe's within SAME_ERROR would fail too, so no full
  evaluation is spent on it (`first_informative`); an overflowing plan is never evaluated;
- lowering back: the units the calibrated fit predicts safe to lower go back together (`safe_block`).
The guide never approves a plan: every plan reported is one a full evaluation confirmed.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from tuner.search.budget import MAX_IMPROVE_UNITS, MAX_PREFIXES
from tuner.search.calibration import ErrorModel, finite

SAME_ERROR = 0.02  # a prefix whose output error is within 2% of a failed one's is predicted to fail too
MISLEADS = 0.9  # a ranking misleads when half of its predicted error is removed and the observed falls < 10%
IMPROVE_AIM = 0.85  # lower units back while the predicted drop stays under this share of the allowed drop


class GuideSpent(Exception):
    """The guide has run the forwards it was given (`Guide.max_forwards`): the search goes on without it."""


class Guide:
    """`predict(fp32_items) -> output error`, memoized, counted (`forwards`) and timed (`seconds`); at most
    `max_forwards` forwards (None: no limit), then GuideSpent for any error not known yet."""

    def __init__(self, predict: Callable[[frozenset[int]], float], *, max_prefixes: int = MAX_PREFIXES,
                 max_units: int = MAX_IMPROVE_UNITS, known: dict[frozenset[int], float] | None = None,
                 max_forwards: int | None = None) -> None:
        self._predict = predict
        self.max_forwards = max_forwards
        self._known: dict[frozenset[int], float] = dict(known or {})
        self.max_prefixes = max(2, max_prefixes)  # prefixes observed one by one; more are sampled
        self.max_units = max(1, max_units)  # units weighed for lowering back per round
        self.forwards = 0
        self.seconds = 0.0

    def error(self, fp32: frozenset[int]) -> float:
        if fp32 not in self._known:
            if self.max_forwards is not None and self.forwards >= self.max_forwards:
                raise GuideSpent(f"the guide's {self.max_forwards} forwards are spent")
            self.forwards += 1
            t0 = time.monotonic()
            value = self._predict(fp32)
            self.seconds += time.monotonic() - t0
            self._known[fp32] = value if math.isfinite(value) else math.inf
        return self._known[fp32]

    def prefix_errors(self, order: Sequence[int]) -> list[float]:
        """The observed error with the first k items of `order` in FP32, k = 0..N (sampled and interpolated
        linearly beyond `max_prefixes`, with both ends always observed)."""
        n, m = len(order), self.max_prefixes
        ks = sorted({round(n * j / (m - 1)) for j in range(m)}) if n >= m else list(range(n + 1))
        # longest prefix first: the model comes from the ranking all FP32, and each shorter prefix holds a few
        # more weights lowered (tuner.measure.held), ending next to the cut the trials probe: at 1.1B a pass in
        # the other order packed every weight twice more
        seen = {k: self.error(frozenset(order[:k])) for k in reversed(ks)}
        out = []
        for k in range(n + 1):
            if k in seen:
                out.append(seen[k])
                continue
            right = next(j for j in ks if j > k)
            left = max(j for j in ks if j < k)
            a, b = finite(seen[left]), finite(seen[right])
            out.append(a + (b - a) * (k - left) / (right - left))
        return out

    @staticmethod
    def misleads(predicted: Sequence[float], observed: Sequence[float]) -> bool:
        """True when the prefix that removes half of the predicted error leaves the observed error almost as
        it was: the ranking's head does not hold what the output error is made of."""
        if not observed or not 0 < observed[0] < math.inf or predicted[0] <= 0:
            return False
        half = next((k for k, r in enumerate(predicted) if r <= predicted[0] / math.sqrt(2)), None)
        return half is not None and 0 < half < len(observed) - 1 and observed[half] >= MISLEADS * observed[0]

    def observed_order(self, items: int, costs: Sequence[float]) -> tuple[list[int], list[float]]:
        """Items ordered by the error each removes when it alone goes to FP32 from the all-low plan
        (e0² − e({i})²), per unit of cost; and those effects (N forwards)."""
        e0 = finite(self.error(frozenset()))
        effect = [max(e0 ** 2 - finite(self.error(frozenset({i}))) ** 2, 0.0) for i in range(items)]
        order = sorted(range(items), key=lambda i: (-effect[i] / max(costs[i], 1e-12), -effect[i], i))
        return order, effect

    def alone_errors(self, items: int) -> list[float]:
        """Each item's output error with it alone in the lower precision, every other item FP32 (N forwards):
        what `--rank exact` measures per op instance, here per unit of the search."""
        everything = frozenset(range(items))
        return [self.error(everything - {i}) for i in range(items)]

    def first_informative(self, model: ErrorModel, lo: int, hi: int) -> int:
        """The shortest prefix in (lo, hi) whose observed error is measurably below prefix lo's (failed);
        hi when there is none."""
        bar = model.residual[lo] * (1.0 - SAME_ERROR)
        return next((k for k in range(lo + 1, hi) if model.residual[k] < bar), hi)

    def safe_block(self, model: ErrorModel, keep: frozenset[int], pool: Sequence[int]) -> list[int]:
        """The items of `pool` (best first) that can go back to the lower precision together while the fit
        predicts a drop under IMPROVE_AIM (one forward per item weighed); when none fits, the one predicted
        closest to passing, alone: the prediction is a fit, not a measurement, and a probe left within the
        bound is better spent on a plan that may pass than kept. An item whose lowering makes the output
        overflow is never offered (that plan fails: no evaluation); with no finite point to fit yet (an error
        model whose only points overflowed), the item whose lowering moves the output least goes alone."""
        block: list[int] = []
        alone: list[tuple[float, int]] = []
        unfit: list[tuple[float, int]] = []
        for item in pool[:self.max_units]:
            error = self.error(keep - set(block) - {item})
            if not math.isfinite(error):
                continue
            predicted = model.predicted_drop(error)
            if predicted is None:
                unfit.append((error, item))
                continue
            if not block:
                alone.append((predicted, item))
            if predicted <= IMPROVE_AIM:
                block.append(item)
        if block:
            return block
        if alone:
            return [min(alone)[1]]
        return [min(unfit)[1]] if unfit else []

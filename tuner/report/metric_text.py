"""How every output writes a metric, so the terminal, report.md, search.html and report.json's readers agree.

A run's metrics are written with one number of significant digits: the fewest,
4 or more, at which every metric it states reads differently from the target and
from the baseline unless it equals them (`metric_digits`). A tune at a tight
tolerance (baseline 1, target 0.99999, a trial at 0.9999866) so reads
`1.00000 -> 0.999987 (target 0.999990)`, never `1 -> 1 (target 1)`; trailing zeros are kept, so a metric
of 1 or 0.1 is not written with fewer digits than those beside it.
"""
from __future__ import annotations

import math
from collections.abc import Iterable

MIN_DIGITS = 4
MAX_DIGITS = 17  # .17g tells any two distinct doubles apart


def fmt_metric(value: float | None, digits: int = MIN_DIGITS) -> str:
    """A metric as every output writes it: `digits` significant digits (`0.9852` at 4), trailing zeros kept, so
    every metric of a run shows as many digits as the others (`1.000`, `0.1000` beside `0.9922`, never `1` or
    `0.1`); `-` for none."""
    if value is None:
        return "-"
    text = f"{value:#.{digits}g}"
    return text[:-1] if text.endswith(".") else text  # `1234.` at 4 digits: no bare point


def _apart(a: float, b: float, digits: int) -> bool:
    return a == b or fmt_metric(a, digits) != fmt_metric(b, digits)


def metric_digits(baseline: float | None, target: float | None, values: Iterable[float | None] = ()) -> int:
    """The fewest significant digits (>= 4) at which baseline, target and each of `values` that differs from
    them read differently from them. Missing (None) and non-finite numbers ask for nothing."""
    refs = [r for r in (baseline, target) if r is not None and math.isfinite(r)]
    shown = [v for v in (baseline, target, *values) if v is not None and math.isfinite(v)]
    pairs = {(v, r) for v in shown for r in refs if v != r}
    digits = MIN_DIGITS
    while digits < MAX_DIGITS and not all(_apart(v, r, digits) for v, r in pairs):
        digits += 1
    return digits


class MetricDigits:
    """`metric_digits` kept up to date as a run's metrics arrive (the terminal's trial lines): a line uses the
    digits the run needed so far, and the last is what the run's summary and files use."""

    def __init__(self) -> None:
        self.baseline: float | None = None
        self.target: float | None = None
        self.values: list[float | None] = []
        self.digits = MIN_DIGITS

    def set_reference(self, baseline: float, target: float) -> int:
        self.baseline, self.target = baseline, target
        return self._update()

    def add(self, value: float | None) -> int:
        self.values.append(value)
        return self._update()

    def _update(self) -> int:
        self.digits = metric_digits(self.baseline, self.target, self.values)
        return self.digits

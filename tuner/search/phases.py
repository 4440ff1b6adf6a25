"""Where a tune's time goes: seconds by phase, with the time inside `evaluate` counted apart.

On a GPU an evaluation takes about a second, so everything mpt does around the evaluations (finding the
candidates, ranking, the guide's forwards, comparing the model after each loan, recording the plan) is what
the user waits for (issue 33). `PhaseClock` times each phase of `TuneSession.run` and subtracts the seconds
spent inside `evaluate` during it (`Evaluator.eval_seconds`), so `own` is mpt's own time by phase: the table
report.json keeps (`seconds.phases`) and the benchmarks print.
"""
from __future__ import annotations

import contextlib
import enum
import time
from collections.abc import Callable, Iterator


class Phase(str, enum.Enum):
    """The phases of one tune, in the order they run (`TuneSession.run`)."""

    BASELINE = "baseline"  # the FP32 evaluations and what surrounds them (a built-in metric's reference)
    CANDIDATES = "candidates"  # the first look, the probe, the recorded forward that finds the op instances
    ALL_LOW = "all-low"  # the all-low trial and the noise check after it
    RANKING = "ranking"  # scoring the candidates (gradient or exact ranking)
    RANGE = "range"  # the range rule's forwards: magnitudes past the lower dtype's range (tuner.measure.ranges)
    SEARCH = "search"  # the trials of the search and the guide's forwards between them
    RESULT = "result"  # proving the chosen plan's weight dtypes, recording it
    REPORT = "report"  # measuring the plan for the report, writing the outputs and the checkpoint


class PhaseClock:
    """Seconds by phase: `own` (mpt's, outside `evaluate`) and `evaluate` (inside it)."""

    def __init__(self, eval_seconds: Callable[[], float]) -> None:
        self._eval_seconds = eval_seconds
        self.own: dict[Phase, float] = {}
        self.evaluate: dict[Phase, float] = {}

    @contextlib.contextmanager
    def phase(self, phase: Phase) -> Iterator[None]:
        """Time the block as `phase` (added to what it already had: a phase may run in several pieces)."""
        t0, e0 = time.monotonic(), self._eval_seconds()
        try:
            yield
        finally:
            inside = self._eval_seconds() - e0
            self.evaluate[phase] = self.evaluate.get(phase, 0.0) + inside
            self.own[phase] = self.own.get(phase, 0.0) + max(0.0, time.monotonic() - t0 - inside)

    def add(self, phase: Phase, seconds: float) -> None:
        """`seconds` of mpt's own time in `phase`, timed by the caller."""
        self.own[phase] = self.own.get(phase, 0.0) + seconds

    def table(self) -> dict[str, dict[str, float]]:
        """{phase: {"own": s, "evaluate": s}} in phase order: report.json's `seconds.phases`."""
        return {p.value: {"own": round(self.own.get(p, 0.0), 4), "evaluate": round(self.evaluate.get(p, 0.0), 4)}
                for p in Phase if p in self.own or p in self.evaluate}

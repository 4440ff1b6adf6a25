"""The search's trials: a set of candidates kept FP32 -> a full evaluation -> a `Probe` for PrecisionSearch."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from tuner.core.errors import Interrupted
from tuner.options.tune import TuneOptions
from tuner.policy.plan import OpInstance
from tuner.search.candidates import Candidates
from tuner.search.changes import Change
from tuner.search.evaluator import Evaluator
from tuner.search.noise import Acceptance, Baseline
from tuner.search.plans import plan_for
from tuner.search.results import StopReason, Trial
from tuner.search.strategy import Probe, SearchStopped


def drop(metric: float | None, base: Baseline, accept: Acceptance) -> float:
    """How far `metric` fell from the baseline, as a share of the drop the target allows (1.0: at it)."""
    allowed = abs(base.value - accept.target)
    if metric is None or not math.isfinite(metric) or allowed == 0:
        return math.inf
    fell = metric - base.value if accept.lower_is_better else base.value - metric
    return fell / allowed


def best_trial(trials: Sequence[Trial], chosen: frozenset[OpInstance] | None,
               fallback: frozenset[OpInstance] = frozenset()) -> Trial | None:
    """The trial that confirmed the search's `chosen` set (those of it in `fallback` run in the fallback dtype)
    when there is one, else the confirmed trial with the fewest FP32 instances, then the fewest in the fallback."""
    passing = [t for t in trials if t.passed and not t.baseline]
    if chosen is not None:
        wanted = tuple(sorted(c.label() for c in chosen - fallback))
        other = tuple(sorted(c.label() for c in chosen & fallback))
        found = [t for t in passing if t.fp32 == wanted and t.fallback == other]
        if found:
            return found[-1]
    return min(passing, key=lambda t: (len(t.fp32), len(t.fallback))) if passing else None


class SearchTrials:
    """Trials by candidate index, as PrecisionSearch asks for them; a set asked for again is not evaluated again.

    Each trial's label says what it changed from the trial before it (tuner.search.changes) and how many
    instances it keeps FP32 as tried. How many of them the plan records (the overrides that change nothing
    dropped) costs a recorded forward, so it is counted once, for the trial whose plan is written
    (`TuneSession.final_fp32`), not for every trial.
    """

    def __init__(self, evaluator: Evaluator, found: Candidates, base: Baseline, accept: Acceptance,
                 options: TuneOptions) -> None:
        self.evaluator = evaluator
        self.found = found
        self.base = base
        self.accept = accept
        self.options = options
        # a fallback chain: the candidates that run in the fallback dtype, not FP32, when a trial keeps them
        # out of the lower dtype (the range rule's, then the search's once their fallback trial passed)
        self.fallback: frozenset[OpInstance] = frozenset()
        self._memo: dict[tuple[frozenset[int], frozenset[OpInstance]], Probe] = {}
        self._last: tuple[str, ...] | None = None  # the FP32 labels of the trial before (None: none yet)

    def rejudge(self, base: Baseline, accept: Acceptance, fp32_idx: frozenset[int], probe: Probe) -> Probe:
        """`probe` (the trial of `fp32_idx`) judged again under a baseline measured anew (noise found after
        it ran): its Probe, and its Trial in the evaluator's list, pass only if `accept` confirms its metric.
        Later trials are judged with `base` and `accept`."""
        self.base, self.accept = base, accept
        labels = tuple(sorted(c.label() for c in self.found.pick(fp32_idx)))  # as Trial.fp32 holds them
        runs = self.evaluator.trials
        at = next((i for i, t in enumerate(runs) if not t.baseline and t.fp32 == labels), None)
        if at is None:  # not evaluated (an all-low plan that overflows): nothing to judge again
            return probe
        trial = runs[at] = dataclasses.replace(runs[at], passed=accept.confirms(runs[at].metric))
        again = Probe(trial.passed, drop(trial.metric, base, accept))
        self._memo[fp32_idx, self.fallback] = again
        return again

    def probe(self, fp32_idx: frozenset[int], scores: Mapping[OpInstance, float]) -> Probe:
        """The candidates in `fp32_idx` stay out of the lower dtype (FP32, or the fallback dtype for those in
        `fallback`), the rest run low. `scores` (the ranking) is PrecisionSearch's to use; the label is the
        change from the previous trial."""
        fp32_idx = self.evaluator.ranks.broadcast(fp32_idx)  # under torchrun every rank tests what rank 0 asks
        if (fp32_idx, self.fallback) in self._memo:  # asked again by the search: already counted and reported
            return self._memo[fp32_idx, self.fallback]
        out = self.found.pick(fp32_idx)
        other = out & self.fallback
        fp32 = out - other
        plan = plan_for(self.options, self.found, fp32, other)
        labels = tuple(sorted(c.label() for c in fp32))
        label = Change.between(self._last, labels).text(self.options.dtype)
        if other:
            label += f"; {len(other)} in {self.options.fallback}"
        self._last = labels
        try:
            trial = self.evaluator.trial(plan, label, self.found.shares_without(fp32), self.accept,
                                         0 if not fp32 else None)
        except (KeyboardInterrupt, Interrupted):
            raise SearchStopped(StopReason.INTERRUPTED) from None
        probe = Probe(trial.passed, drop(trial.metric, self.base, self.accept))
        self._memo[fp32_idx, self.fallback] = probe
        return probe

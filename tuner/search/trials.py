"""The search's trials: a set of candidates kept FP32 -> a full evaluation -> a `Probe` for PrecisionSearch."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from tuner.core.errors import Interrupted
from tuner.options.tune import TuneOptions
from tuner.policy.plan import OpInstance
from tuner.search.candidates import Candidates
from tuner.search.evaluator import Evaluator
from tuner.search.noise import Acceptance, Baseline
from tuner.search.plans import plan_for
from tuner.search.results import StopReason, Trial
from tuner.search.strategy import Probe, SearchStopped


def trial_label(fp32_idx: frozenset[int], found: Candidates, scores: Mapping[OpInstance, float], dtype: str) -> str:
    """What a trial tries, in words: the modules it keeps FP32, the most damaging first."""
    if not fp32_idx:
        return f"all eligible in {dtype}"
    weight: dict[str, float] = {}
    for i in fp32_idx:
        cand = found.instances[i]
        weight[cand.module] = weight.get(cand.module, 0.0) + scores.get(cand, 0.0) ** 2
    names = [m or "(root)" for m in sorted(weight, key=lambda m: (-weight[m], m))]
    modules = f"{len(names)} module{'s' if len(names) > 1 else ''}" if len(names) > 1 else names[0]
    shown = ": " + ", ".join(names[:3]) + (" ..." if len(names) > 3 else "") if len(names) > 1 else ""
    return f"{len(fp32_idx)} in FP32 ({modules}){shown}"


def drop(metric: float | None, base: Baseline, accept: Acceptance) -> float:
    """How far `metric` fell from the baseline, as a share of the drop the target allows (1.0: at it)."""
    allowed = abs(base.value - accept.target)
    if metric is None or not math.isfinite(metric) or allowed == 0:
        return math.inf
    fell = metric - base.value if accept.lower_is_better else base.value - metric
    return fell / allowed


def best_trial(trials: Sequence[Trial], chosen: frozenset[OpInstance] | None) -> Trial | None:
    """The trial that confirmed the search's `chosen` set when there is one, else the smallest confirmed set."""
    passing = [t for t in trials if t.passed and not t.baseline]
    if chosen is not None:
        wanted = tuple(sorted(c.label() for c in chosen))
        found = [t for t in passing if t.fp32 == wanted]
        if found:
            return found[-1]
    return min(passing, key=lambda t: len(t.fp32)) if passing else None


class SearchTrials:
    """Trials by candidate index, as PrecisionSearch asks for them; a set asked for again is not evaluated again."""

    def __init__(self, evaluator: Evaluator, found: Candidates, base: Baseline, accept: Acceptance,
                 options: TuneOptions) -> None:
        self.evaluator = evaluator
        self.found = found
        self.base = base
        self.accept = accept
        self.options = options
        self._memo: dict[frozenset[int], Probe] = {}

    def probe(self, fp32_idx: frozenset[int], scores: Mapping[OpInstance, float]) -> Probe:
        """The candidates in `fp32_idx` stay FP32, the rest run low; `scores` (the ranking) word the label."""
        fp32_idx = self.evaluator.ranks.broadcast(fp32_idx)  # under torchrun every rank tests what rank 0 asks
        if fp32_idx in self._memo:  # asked again by the search: already counted and reported
            return self._memo[fp32_idx]
        fp32 = self.found.pick(fp32_idx)
        plan = plan_for(self.options, self.found.fp32_modules, fp32)
        label = trial_label(fp32_idx, self.found, scores, self.options.dtype)
        try:
            trial = self.evaluator.trial(plan, label, self.found.shares_without(fp32), self.accept)
        except (KeyboardInterrupt, Interrupted):
            raise SearchStopped(StopReason.INTERRUPTED) from None
        probe = Probe(trial.passed, drop(trial.metric, self.base, self.accept))
        self._memo[fp32_idx] = probe
        return probe

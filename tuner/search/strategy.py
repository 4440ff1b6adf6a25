"""The fallback search: which ranked op instances must stay in FP32.

Pure algorithm over a `test(fp32_set) -> Probe` oracle (a bool is accepted
too), so it runs on real models (session.py) and on planted oracles (tests,
benchmarks/search_evals.py). Each test is one full evaluation.

Two regimes, one search:
- *a few fragile ops* (a planted bug, an overflow): their scores stand far above
  the rest (a gap); the top g go first, and the search probes g, then g-1.
- *many small contributors* (real CNNs and transformers): the error of many ops
  adds up. The candidates are ordered by error removed per unit of cost
  (score² / cost, cost = the op's FLOPs plus its output size), so the FP32 set is
  the cheapest one that removes the most error, and the search looks for the
  shortest prefix of that order that passes.

The cut is found by a bracketed search on the prefix length. Each probe is
placed where a calibrated model predicts the target lies: the predicted
residual error of a prefix (the quadrature sum of the scores left in the lower
precision) maps to the measured metric drop as drop = a·error^p, fitted to the
probes so far (the all-low trial is the first point). The guess is clamped so
that the bracket always shrinks at least as fast as bisection would with the
probes left, so the cut costs at most ceil(log2 N) + 1 probes, usually fewer,
and it stops early once the undecided instances hold under 1% of the cost.
Probes left within that bound then lower back the prefix's heavy instances.

With `predict` (a plan's observed output error on the example inputs, one cheap
forward: tuner.search.guide) a ranking without a gap gives way, where all-low misses
the target by little and forwards are cheap, to each unit's error measured alone,
the residuals are observed rather than inferred,
a ranking they contradict is rebuilt from observed effects, prefixes predicted
to fail like a failed probe cost no evaluation, and lowering back goes in blocks
the calibrated fit predicts safe (`_lower_guided`), then trades units (`_trade`);
without it, one at a time, heaviest per unit of error first (`_lower_heavy`).
`thorough=True` then proves every instance of the prefix necessary by group
testing (Hwang's generalized binary splitting), at more evaluations.
A search that would still end with every unit FP32 while probes are left (the
order put what the metric needs last, and lowering back had nothing to offer)
spends them on a bisection over another order first (`_rescue`).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from tuner.search.calibration import ErrorModel, finite
from tuner.search.guide import Guide, GuideSpent

GAP = 8.0  # score ratio that counts as a clear gap in the ranking
STOP_COST_SHARE = 0.01  # stop refining the cut once the undecided instances cost less than this share
HEAVY_COST_SHARE = 0.001  # an FP32 instance worth trying to lower back: at least this share of the cost
GAIN_COST_SHARE = 0.01  # guided: lowering back is worth an evaluation when it moves at least this share
SPREAD_DROP = 1.5  # spread loss near the target: an all-low drop of at most this share of the allowed drop
TRADE_AIM = 2.0  # a trade is tried when the fit predicts a drop of at most twice the allowed: on the dev split
#                  the fit over-predicted trades by up to 1.7x (one passed at a predicted 1.64), and those it
#                  predicted above 2 all failed


class SearchStopped(Exception):
    """Raised by `test` when a bound (evaluations, time, an interrupt) stops the search; `reason` says which."""

    def __init__(self, reason: object) -> None:
        super().__init__(str(reason))
        self.reason = reason


@dataclass(frozen=True)
class Probe:
    """One test's outcome: passed, and the metric drop as a share of the allowed drop (1.0: at the target)."""

    passed: bool
    drop: float | None = None  # None: unknown (an oracle that only says pass/fail)


@dataclass
class SearchOutcome:
    fp32: frozenset[int] | None  # best confirmed FP32 set (None: nothing passed)
    evals: int
    stopped: object | None = None  # SearchStopped.reason: why the search was cut short
    notes: list[str] = field(default_factory=list)
    trusted_gap: bool = False


def gap_index(scores: Sequence[float], *, gap: float = GAP, max_share: float = 0.5) -> int | None:
    """g such that the top-g scores are >= gap times the next one; None without a clear gap."""
    ordered = sorted(scores, reverse=True)
    n = len(ordered)
    best, best_ratio = None, gap
    floor = max(ordered[-1] if ordered else 0.0, 1e-12)
    for i in range(1, max(1, int(n * max_share)) + 1):
        if i >= n:
            break
        hi, lo = ordered[i - 1], max(ordered[i], floor)
        if hi <= 0:
            break
        ratio = hi / lo
        if ratio >= best_ratio:
            best, best_ratio = i, ratio
    return best


def search_order(scores: Sequence[float], costs: Sequence[float] | None = None) -> tuple[list[int], int | None]:
    """Items in the order they go to FP32, and the gap g (the top g by score lead) or None.

    Without a gap, items are ordered by score² / cost: the error they remove
    (errors add in quadrature) per unit of what keeping them in FP32 costs.
    """
    n = len(scores)
    cost = list(costs) if costs is not None else [1.0] * n
    g = gap_index(scores)
    by_score = sorted(range(n), key=lambda i: (-finite(scores[i]), i))
    head = by_score[:g] if g is not None else []
    rest = [i for i in range(n) if i not in set(head)]
    rest.sort(key=lambda i: (-finite(scores[i]) ** 2 / max(cost[i], 1e-12), -finite(scores[i]), i))
    return head + rest, g


class PrecisionSearch:
    """Runs the steps in the module docstring; `test` gets the FP32 set (item indices).

    Bounds are the caller's: its `test` raises SearchStopped, and the outcome
    keeps the best FP32 set confirmed before that. `costs` weigh the order
    (default: all equal); `extra_probes` is the slack over ceil(log2 N) the
    cut may spend on calibrated guesses. `predict` (FP32 set -> the plan's output error on the example
    inputs, one cheap forward: `tuner.search.guide`) guides the order, the probes and the lowering back;
    `guide` is the same with its limits set (a Guide).
    """

    def __init__(self, scores: Sequence[float], test: Callable[[frozenset[int]], Probe | bool], *,
                 costs: Sequence[float] | None = None, thorough: bool = False, all_low_failed: bool = False,
                 all_low_drop: float | None = None, extra_probes: int = 1,
                 predict: Callable[[frozenset[int]], float] | None = None, guide: Guide | None = None) -> None:
        self.scores = list(scores)
        self.costs = list(costs) if costs is not None else [1.0] * len(self.scores)
        self._test = test
        self.thorough = thorough
        self.all_low_failed = all_low_failed
        self.all_low_drop = all_low_drop
        self.order, self.gap = search_order(self.scores, self.costs)
        self.model = ErrorModel([self.scores[i] for i in self.order])
        self.model.observe(0, all_low_drop)
        self.budget = math.ceil(math.log2(max(2, len(self.scores)))) + extra_probes
        self.count = 0
        self.best: frozenset[int] | None = None
        self.notes: list[str] = []
        self.tested: dict[int, bool] = {}
        self.results: dict[frozenset[int], Probe] = {}  # every set tested, and its probe
        self.guide = guide if guide is not None else Guide(predict) if predict is not None else None
        self.weight = [finite(s) ** 2 for s in self.scores]  # each item's error, squared (errors add so)
        self._keep: frozenset[int] = frozenset()  # lowering back: the FP32 set of the last plan that passed

    # --- tests ------------------------------------------------------------------------------------------------
    def test(self, fp32: frozenset[int]) -> Probe:
        """The probe of `fp32`; a set tested before is answered from memory and not counted, so the bound's
        probes all go to plans not yet measured."""
        known = self.results.get(fp32)
        if known is not None:
            return known
        self.count += 1
        probe = self._test(fp32)
        if isinstance(probe, bool):
            probe = Probe(probe)
        self.results[fp32] = probe
        if probe.passed and (self.best is None or self._cost(fp32) < self._cost(self.best)):
            self.best = fp32
        return probe

    def _prefix(self, k: int) -> frozenset[int]:
        return frozenset(self.order[:k])

    def _probe_prefix(self, k: int) -> bool:
        probe = self.test(self._prefix(k))
        self.tested[k] = probe.passed
        self.model.observe(k, probe.drop)
        return probe.passed

    def _cost(self, items: frozenset[int]) -> tuple[float, int]:
        return sum(self.costs[i] for i in items), len(items)

    def _left(self) -> int:
        """Probes left within the bound."""
        return self.budget - self.count + (0 if self.all_low_failed else 1)

    # --- the search -------------------------------------------------------------------------------------------
    def run(self) -> SearchOutcome:
        try:
            trusted = self._run()
            return SearchOutcome(self.best, self.count, None, self.notes, trusted)
        except SearchStopped as stop:
            return SearchOutcome(self.best, self.count, stop.reason, self.notes, False)

    def _run(self) -> bool:
        n = len(self.scores)
        if not self.all_low_failed:
            probe = self.test(frozenset())
            if probe.passed:
                self.notes.append("everything eligible passes in the lower precision")
                return False
            self.all_low_drop = probe.drop
            self.model.observe(0, probe.drop)
        if n == 0:
            return False
        self.tested[0] = False
        if self.guide is not None:
            self._measure_alone()
            self._observe_prefixes()
        lo, hi, trusted = self._gap_probes(n)
        if not trusted:
            lo, hi = self._cut(lo, hi)
        if not self.tested.get(hi, False):
            self._probe_prefix(hi)  # every probe failed: the whole prefix, to confirm it
        if self.thorough and hi > 1:
            self._prove_necessary(self.order[:hi])
        elif not trusted and self.tested.get(hi):
            if self.guide is not None:
                self._lower_guided(self.order[:hi])
            else:
                self._lower_heavy(self.order[:hi])
        if not self.thorough:
            self._rescue()
        return trusted

    def _rescue(self) -> None:
        """Every unit still FP32 with probes left within the bound: the order misled the cut (the units the
        metric needs ranked last, so every shorter prefix failed) and lowering back found nothing it could
        offer (the units it weighs first are the needed ones, or their lowering overflows). Bisect over
        another order before giving up (`_rescue_order`): each probe keeps a prefix of it FP32; a prefix that
        leaves a proven-needed unit low, or lies within a plan that failed, or whose output the guide sees
        overflow, fails without an evaluation; the best confirmed plan stays. Stops, like the cut, once the
        undecided units hold under STOP_COST_SHARE of the cost."""
        everything = frozenset(range(len(self.scores)))
        if self.best != everything or self._left() <= 0:
            return
        order, lo = self._rescue_order()
        hi, total = len(order), sum(self.costs) or 1.0
        failed = [fp32 for fp32, probe in self.results.items() if not probe.passed]
        while hi - lo > 1 and self._left() > 0 \
                and sum(self.costs[i] for i in order[lo:hi]) > STOP_COST_SHARE * total:
            m = (lo + hi) // 2
            trial = frozenset(order[:m])
            if any(trial <= f for f in failed) or self._overflows(trial) or not self.test(trial).passed:
                lo = m
            else:
                hi = m
        if self.best != everything:
            self.notes.append(f"the search ended with every unit FP32 and trials left; a bisection over the "
                              f"units the ranking put last, first, kept {len(self.best or ())} of "
                              f"{len(everything)} FP32")

    def _rescue_order(self) -> tuple[list[int], int]:
        """The rescue's order: units a failed trial proved needed (it held every other unit FP32) first, then
        the cut's order reversed (what the ranking called harmless is where the need was); and how many
        were proved needed (a shorter prefix leaves one of them low: it fails)."""
        n = len(self.scores)
        needed = {next(iter(set(range(n)) - fp32)) for fp32, probe in self.results.items()
                  if not probe.passed and len(fp32) == n - 1}
        rank = {item: pos for pos, item in enumerate(reversed(self.order))}
        return sorted(range(n), key=lambda i: (i not in needed, rank[i])), len(needed)

    def _overflows(self, fp32: frozenset[int]) -> bool:
        """The guide sees this plan's output overflow (it fails: no evaluation); False without a guide or its
        forwards."""
        if self.guide is None:
            return False
        try:
            return not math.isfinite(self.guide.error(fp32))
        except GuideSpent:
            return False

    def _measure_alone(self) -> None:
        """Spread loss near the target: no gap in the ranking, and the all-low trial misses the target by under
        half the allowed drop (SPREAD_DROP), where the guide's forwards are cheap (no limit on them, and up to
        twice its prefixes of units). The plan then removes a small share of the error, and which units carry
        it at the least cost is decided between many of similar score: the ranking's first-order estimates
        (a few random probes: tens of percent apart per score) decide that badly, so each unit's output error
        is measured alone in the lower precision (every other unit FP32, one forward each) and the order comes
        from those, per unit of cost. On all-MiniLM-L6-v2 at a cosine target of 1e-5 (all-bf16 misses it by
        a third) the estimates put 14% of the FLOPs in FP32 where the measured errors need 6%
        (benchmarks/hazards/minilm_spread_real.py, issue 46). Farther from the target the plan keeps most of
        the error's carriers FP32, the ranking (taken in the all-low plan) sees those well, and the measured
        order was worse as often as better on the gauntlet's small models: the ranking's order stays."""
        guide = self.guide
        n = len(self.scores)
        drop = self.all_low_drop
        if guide is None or self.gap is not None or guide.max_forwards is not None or n > 2 * guide.max_prefixes \
                or drop is None or not 1.0 < drop <= SPREAD_DROP:
            return
        alone = guide.alone_errors(n)
        self.order = sorted(range(n), key=lambda i: (-finite(alone[i]) ** 2 / max(self.costs[i], 1e-12), i))
        self.model = ErrorModel([alone[i] for i in self.order])
        self.model.observe(0, drop)
        self.weight = [finite(a) ** 2 for a in alone]
        self.notes.append(f"the error is spread and all-low misses the target by little: each unit's output error "
                          f"was measured alone in the lower precision ({n} forwards), and the order comes from those")

    def _observe_prefixes(self) -> None:
        """Observed output errors replace the predicted residuals; a ranking they contradict gives way to an
        order from each item's own observed effect (without a gap: a gap is its own evidence; and only up to
        twice the guide's prefixes, one forward per item)."""
        assert self.guide is not None
        errors = self.guide.prefix_errors(self.order)
        if self.gap is None and len(self.scores) <= 2 * self.guide.max_prefixes \
                and self.guide.misleads(self.model.residual, errors):
            try:
                self.order, effect = self.guide.observed_order(len(self.scores), self.costs)
                self.weight = effect
                self.notes.append("the ranking did not predict the output error of its own prefixes; the "
                                  "order comes from each unit's observed effect instead")
                errors = self.guide.prefix_errors(self.order)
            except GuideSpent:  # the ranking's order stands, with the errors its prefixes showed
                self.notes.append("the ranking did not predict the output error of its own prefixes, and the "
                                  "guide's forwards did not stretch to observing each unit alone")
        self.model.use_observed(errors)

    def _lower_guided(self, fp32: list[int]) -> None:
        """Lower back together the FP32 units the calibrated fit predicts safe (observed errors, one forward
        each), while probes are left and the gain is worth an evaluation (GAIN_COST_SHARE of the cost); then
        trade (`_trade`). Where the guide's forwards are spent (a large model's budget, `tuner.search.budget`)
        the probes left lower the heaviest FP32 units one at a time, from the last plan that passed."""
        assert self.guide is not None
        self._keep = frozenset(fp32)
        try:
            self._lower_blocks()
        except GuideSpent:
            self.notes.append(f"the guide's {self.guide.forwards} forwards were spent; the probes left lower "
                              "the heaviest FP32 units one at a time")
            self._lower_heavy(sorted(self._keep))

    def _lower_blocks(self) -> None:
        """`_lower_guided`'s rounds: each trial's plan is kept in `_keep` once it passes, before its error is
        observed (the forward that may find the guide spent)."""
        assert self.guide is not None
        refused = set[int]()
        while self._left() > 0:
            keep = self._keep
            block = self.guide.safe_block(self.model, keep, self._pool(keep, refused))
            if not block:
                self._trade()
                return
            trial = keep - set(block)
            known = trial in self.results  # (a prefix the cut saw fail): no probe spent, and the fit has it
            probe = self.test(trial)
            if probe.passed:
                self._keep = trial
            elif len(block) == 1 or known:
                refused.add(block[-1])  # a known result spent nothing: refusing one item keeps the loop moving
            if not known:
                self.model.observe_error(self.guide.error(trial), probe.drop)

    def _pool(self, keep: frozenset[int], refused: AbstractSet[int]) -> list[int]:
        """The FP32 units worth an evaluation to lower back (GAIN_COST_SHARE of the cost or more), heaviest per
        unit of error first."""
        total = sum(self.costs) or 1.0
        return sorted((i for i in keep if i not in refused and self.costs[i] >= GAIN_COST_SHARE * total),
                      key=lambda i: -self.costs[i] / max(self.weight[i], 1e-30))

    def _trade(self) -> None:
        """Probes left and no FP32 unit goes back alone: trade. A lowered unit returns to FP32 while FP32 units
        of more cost go down (`_traded`): a cheaper plan, for the ranking can put one of two equally heavy
        units first when the other is what the metric needs. Of the lowered units with the most error by
        the ranking (the guide's units per round), the half whose return lowers the observed error most are
        weighed (a forward each, and one per trade); the trade the fit predicts least drop for is tried,
        while probes are left and the fit predicts a drop of at most TRADE_AIM. From `_keep`, kept current."""
        guide = self.guide
        assert guide is not None
        while self._left() > 0:
            keep = self._keep
            lowered = sorted((v for v in range(len(self.scores)) if v not in keep),
                             key=lambda v: -self.weight[v])[:guide.max_units]  # the most error, by the ranking
            back = sorted(lowered, key=lambda v: guide.error(keep | {v}))[:max(1, guide.max_units // 2)]
            trades = []
            for trial in (self._traded(keep, v) for v in back):
                drop = None if trial is None else self.model.predicted_drop(guide.error(trial))
                if trial is not None and drop is not None and drop <= TRADE_AIM:
                    trades.append((drop, self._cost(trial), trial))
            if not trades:
                return
            trial = min(trades, key=lambda t: t[:2])[2]
            probe = self.test(trial)
            if probe.passed:
                self._keep = trial
            self.model.observe_error(guide.error(trial), probe.drop)

    def _traded(self, keep: frozenset[int], v: int) -> frozenset[int] | None:
        """`keep` with lowered unit `v` back in FP32 and, in the pool's order, as many FP32 units lowered as
        outweigh it by GAIN_COST_SHARE of the cost; None when they cannot, or the plan was measured before."""
        base, total = keep | {v}, sum(self.costs) or 1.0
        block: list[int] = []
        gain = -self.costs[v]
        for i in self._pool(base, {v}):
            block.append(i)
            gain += self.costs[i]
            if gain >= GAIN_COST_SHARE * total:
                trial = base - set(block)
                return None if trial in self.results else trial
        return None

    def _lower_heavy(self, fp32: list[int]) -> None:
        """With probes left within the bound: try lowering, one at a time, the FP32 instances that cost most
        per unit of error they remove (a heavy op the cut swept in with the ones that matter)."""
        total = sum(self.costs) or 1.0
        keep = set(fp32)
        heavy = sorted((i for i in fp32 if self.costs[i] > HEAVY_COST_SHARE * total),
                       key=lambda i: -self.costs[i] / max(finite(self.scores[i]) ** 2, 1e-30))
        for item in heavy:
            if self._left() <= 0:
                break
            if self.test(frozenset(keep - {item})).passed:
                keep.discard(item)

    def _gap_probes(self, n: int) -> tuple[int, int, bool]:
        """With a clear gap g: probe g, then g-1. Returns the bracket (lo fails, hi passes) and whether the
        gap settled it (the top g all needed)."""
        g = self.gap
        if g is None or g >= n:
            return 0, n, False
        if not self._probe_prefix(g):
            return g, n, False
        if g == 1:
            return 0, 1, True
        if not self._probe_prefix(g - 1):
            self.notes.append(f"the ranking had a clear gap after {g} instances; they stay in FP32"
                              + ("" if self.thorough else " (--thorough proves each one necessary)"))
            return g - 1, g, not self.thorough
        return 0, g - 1, False

    def _cut(self, lo: int, hi: int) -> tuple[int, int]:
        """Shrink the bracket (prefix lo fails, prefix hi passes) to adjacent lengths, or until the undecided
        instances cost too little to matter."""
        total = sum(self.costs) or 1.0
        while hi - lo > 1:
            undecided = sum(self.costs[i] for i in self.order[lo:hi])
            if self.tested.get(hi) and undecided <= STOP_COST_SHARE * total:
                self.notes.append(f"stopped refining the cut: the {hi - lo - 1} undecided instances hold under "
                                  f"{STOP_COST_SHARE:.0%} of the candidates' cost; they stay in FP32")
                break
            if self.guide is not None:  # prefixes that leave the error of a failed one would fail as well
                lo = self.guide.first_informative(self.model, lo, hi) - 1
                if hi - lo <= 1:
                    break
            m = self._next_probe(lo, hi)
            if self._probe_prefix(m):
                hi = m
            else:
                lo = m
        return lo, hi

    def _next_probe(self, lo: int, hi: int) -> int:
        """The calibrated guess, clamped so the bracket shrinks at least as fast as the probes left require."""
        left = max(1, self._left())
        need = math.ceil(math.log2(hi - lo))
        mid = (lo + hi) // 2
        if left < need:  # the bound is already lost (a bound of the caller, a noisy metric): bisect
            return mid
        reach = 2 ** (left - 1)
        low_end, high_end = max(lo + 1, hi - reach), min(hi - 1, lo + reach)
        guess = self.model.guess(lo, hi)
        if guess is None or low_end > high_end:
            return mid
        return min(high_end, max(low_end, guess))

    def _prove_necessary(self, prefix: list[int]) -> None:
        """Group testing over the FP32 prefix, everything else lowered: which of them are really needed."""
        good = set(self.order) - set(prefix)
        bad: set[int] = set()
        queue = list(reversed(prefix))  # least suspicious first
        known_positive = True
        d = 1

        def lowered(extra: list[int]) -> frozenset[int]:
            down = good | set(extra)
            return frozenset(i for i in self.order if i not in down)

        while queue:
            if not known_positive:
                if self.test(lowered(queue)).passed:
                    good.update(queue)
                    break
            m = len(queue)
            if m == 1:
                bad.add(queue.pop())
                known_positive = False
                continue
            size = min(m, 2 ** max(0, int(math.floor(math.log2(max(1.0, (m - d + 1) / d))))))
            group = queue[:size]
            if size < m and self.test(lowered(group)).passed:
                good.update(group)
                del queue[:size]
                continue
            while len(group) > 1:  # `group` holds a needed instance: binary search for it
                half = group[: len(group) // 2]
                if self.test(lowered(half)).passed:
                    good.update(half)
                    group = group[len(group) // 2:]
                else:
                    group = half
            bad.add(group[0])
            queue = [i for i in queue if i != group[0] and i not in good]
            known_positive = False
        if self.best is None or self._cost(frozenset(bad)) <= self._cost(self.best):
            self.best = frozenset(bad)

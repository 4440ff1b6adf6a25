"""The fallback search: which ranked op instances must stay in FP32.

Pure algorithm over a `test(fp32_set) -> passed` oracle, so it can be run on
real models (tune.py) and on planted oracles (tests, benchmarks/search_evals.py).

Items are op instances ranked by suspicion (most suspicious first), from cheap
forward passes. Steps, each test a full evaluation:
1. all lower precision (FP32 set empty). Pass: done. (Skipped when the caller
   already ran it and saw it fail: `all_low_failed=True`.)
2. Binary search for the shortest FP32 prefix of the ranking that passes.
   When the scores show a clear gap (the top g items score >= GAP times the
   rest), the first probe is at g and the next at g-1, so a good ranking costs
   two probes whatever the number of fragile ops.
3. Shrink: items above the last one of that prefix may be harmless ops ranked
   high. Unless the prefix ended at a clear gap (the ranking is then trusted),
   group testing lowers them back in halves, least suspicious first.
Worst case without a usable gap: ceil(log2 N) + about 2(k-1)·log2(N/k) tests.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

GAP = 8.0  # score ratio that counts as a clear gap in the ranking


class SearchStopped(Exception):
    """Raised by `test` when a bound (evaluations, time, an interrupt) stops the search; `reason` says which."""

    def __init__(self, reason: object) -> None:
        super().__init__(str(reason))
        self.reason = reason


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


class FallbackSearch:
    """Runs the steps above; `test` is called with the FP32 set (indices into `ranked`' items).

    Bounds are the caller's: its `test` raises SearchStopped, and the outcome
    keeps the best FP32 set confirmed before that.
    """

    def __init__(self, ranked: Sequence[int], scores: Sequence[float], test: Callable[[frozenset[int]], bool], *,
                 thorough: bool = False, all_low_failed: bool = False) -> None:
        self.ranked = list(ranked)
        self.scores = list(scores)
        self._test = test
        self.thorough = thorough
        self.all_low_failed = all_low_failed
        self.count = 0
        self.best: frozenset[int] | None = None
        self.notes: list[str] = []

    def test(self, fp32: frozenset[int]) -> bool:
        self.count += 1
        passed = self._test(fp32)
        if passed and (self.best is None or len(fp32) < len(self.best)):
            self.best = fp32
        return passed

    def run(self) -> SearchOutcome:
        try:
            trusted = self._run()
            return SearchOutcome(self.best, self.count, None, self.notes, trusted)
        except SearchStopped as stop:
            return SearchOutcome(self.best, self.count, stop.reason, self.notes, False)

    def _run(self) -> bool:
        n = len(self.ranked)
        if not self.all_low_failed and self.test(frozenset()):
            self.notes.append("everything eligible passes in the lower precision")
            return False
        if n == 0:
            return False
        by_item = dict(zip(self.ranked, self.scores))
        g = gap_index([by_item[i] for i in self.ranked])
        self.good: set[int] = set()  # lowered, known safe
        self.bad: set[int] = set()  # must stay FP32
        undecided = list(self.ranked)  # most suspicious first
        if g is not None and g < n:
            top = self.ranked[:g]
            if self.test(frozenset(top)):
                self.good.update(self.ranked[g:])
                undecided = top
                if g == 1:
                    self.bad.add(top[0])
                    return True
                # One more probe: is the weakest of the top group needed?
                if not self.test(frozenset(top[:-1])):
                    self.bad.add(top[-1])
                    if not self.thorough:
                        self.bad.update(top[:-1])
                        self.notes.append(f"ranking had a clear gap after {g} instances; they stay in FP32 "
                                          "(thorough search proves each one necessary)")
                        return True
                    undecided = top[:-1]
                    self._splitting(undecided, known_positive=False)
                    return True
                self.good.add(top[-1])
                undecided = top[:-1]
            # else: the rest holds a fragile op; fall through to splitting over everything
        self._splitting(undecided, known_positive=True)
        return False

    def _lower(self, extra: list[int] | set[int]) -> frozenset[int]:
        """The FP32 set when `extra` is lowered on top of the known-good ones."""
        lowered = self.good | set(extra)
        return frozenset(i for i in self.ranked if i not in lowered)

    def _splitting(self, undecided: list[int], *, known_positive: bool) -> None:
        """Hwang's generalized binary splitting, least suspicious items first.

        A test lowers a group (plus everything known good) and keeps the rest in
        FP32: it passes iff the group holds no fragile op.
        """
        queue = list(reversed(undecided))  # least suspicious first
        d = 1
        while queue:
            if not known_positive:
                if self.test(self._lower(queue)):
                    self.good.update(queue)
                    break
                known_positive = True
            m = len(queue)
            if m == 1:
                self.bad.add(queue.pop())
                known_positive = False
                continue
            alpha = max(0, int(math.floor(math.log2(max(1.0, (m - d + 1) / d)))))
            size = min(m, 2 ** alpha)
            group = queue[:size]
            if size < m or not known_positive:
                if self.test(self._lower(group)):
                    self.good.update(group)
                    del queue[:size]
                    continue
            # `group` holds a fragile op: binary search for one.
            while len(group) > 1:
                half = group[: len(group) // 2]
                if self.test(self._lower(half)):
                    self.good.update(half)
                    group = group[len(group) // 2:]
                else:
                    group = half
            self.bad.add(group[0])
            queue.remove(group[0])
            for item in list(queue):
                if item in self.good:
                    queue.remove(item)
            known_positive = False
        self.best = frozenset(self.bad) if self.best is None or len(self.bad) <= len(self.best) else self.best

"""The best known plan of a tuning task, at any evaluation cost: a reference for the quality of mpt's plan.

`best_plan(build, evaluate, example_inputs, options)` decides the same units mpt's search decides (the
candidates one module's own code calls: `Candidates.units()`), and evaluates every plan exactly as a trial
does (`TuneSession` -> `SearchTrials.probe` -> `Evaluator.trial`: `plan_for`, the deployed model, the same
`Acceptance`). The objective is the plan's lower-precision FLOP share (`Candidates.shares_without`, the share
a trial reports). Units with no matmul/conv FLOPs cost no share, so they stay FP32 throughout; the search is
over the units that carry FLOPs:

1. every FLOP unit FP32 (must pass, else no plan exists) and each FLOP unit alone lowered (its measured drop);
2. two orderings (measured drop per FLOP, and measured drop), each bisected for its longest passing prefix;
3. from each prefix, and from every FLOP unit FP32, greedy local search until no single change improves the share: lower one more unit
   (heaviest first), or swap (raise a lowered unit, lower a heavier FP32 one). An optional cap bounds the
   evaluations; the best passing plan seen by any step is the answer.

`start` adds a known plan (e.g. mpt's) as one more starting point of step 3, so the answer is at least as
good as it when it passes. Metrics like accuracy are not monotone in the FP32 set, so the answer is the best
*known* plan (a local optimum over single changes and swaps), not a proven optimum.

Run on one model file: `python benchmarks/oracle.py MODEL.py --dtype bf16 --tolerance 0.01 [--lower-is-better]`
prints mpt's share, the oracle's, and their ratio.
"""
from __future__ import annotations

import argparse
import runpy
import sys
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tuner.options.tune import TuneOptions  # noqa: E402
from tuner.policy.plan import OpInstance, Plan  # noqa: E402
from tuner.search.candidates import Candidates  # noqa: E402
from tuner.search.plans import plan_for  # noqa: E402
from tuner.search.session import TuneSession, tune  # noqa: E402
from tuner.search.trials import SearchTrials  # noqa: E402


@dataclass
class OracleResult:
    share: float | None  # lower-precision FLOP share of the best plan (None: no plan meets the target)
    fp32: frozenset[OpInstance] | None  # the candidates that plan keeps FP32
    metric: float | None
    target: float
    baseline: float
    evals: int  # full evaluations the oracle spent (its baseline's runs included)
    units: int  # units mpt decides (all of them)
    flop_units: int  # units that carry matmul/conv FLOPs (the ones the oracle decides)
    candidates: int
    plan: Plan | None = None  # the plan to deploy (`plan_for`, as a tune writes it)
    all_low_metric: float | None = None
    all_low_passed: bool = False
    notes: list[str] = field(default_factory=list)


class Lab:
    """A tune session stopped after the candidates: evaluates FP32 sets of units as trials."""

    def __init__(self, build: Callable[[], Any], evaluate: Callable[[Any], Any], example_inputs: Any,
                 options: TuneOptions) -> None:
        if options.max_evals is not None or options.time_budget is not None:
            options = TuneOptions(**{**options.__dict__, "max_evals": None, "time_budget": None})
        self.session = TuneSession(build, evaluate, example_inputs, options)
        self.base, self.accept, recorded = self.session.measure_baseline()
        if not self.base.complete:  # no all-low trial settles it here: the noise is measured at once
            self.base, self.accept = self.session.complete_baseline(self.base)
        inputs = self.session.example_inputs(recorded)
        self.found: Candidates = self.session.find_candidates(inputs)
        self.session.evaluator.inputs = self.found.inputs
        self.trials = SearchTrials(self.session.evaluator, self.found, self.base, self.accept, options)
        self.units = self.found.units()
        self.unit_flops = [sum(self.found.flops[self.found.instances[i]] for i in u) for u in self.units]
        self.metrics: dict[frozenset[int], float | None] = {}

    @property
    def evals(self) -> int:
        return self.session.evaluator.evals

    def fp32_of(self, fp32_units: Iterable[int]) -> frozenset[OpInstance]:
        return self.found.pick(frozenset(i for n in fp32_units for i in self.units[n]))

    def share(self, fp32_units: Iterable[int]) -> float:
        return self.found.shares_without(self.fp32_of(fp32_units)).flop_share

    def run(self, fp32_units: Iterable[int]) -> tuple[bool, float]:
        """(passed, drop as a share of the allowed drop) of the plan keeping these units FP32: one trial."""
        idx = frozenset(i for n in fp32_units for i in self.units[n])
        probe = self.trials.probe(idx, {})
        if idx not in self.metrics:
            self.metrics[idx] = self.session.evaluator.trials[-1].metric
        return probe.passed, probe.drop if probe.drop is not None else float("inf")

    def metric(self, fp32_units: Iterable[int]) -> float | None:
        idx = frozenset(i for n in fp32_units for i in self.units[n])
        if idx not in self.metrics:
            self.run(fp32_units)
        return self.metrics[idx]


class _Budget(Exception):
    pass


class _Search:
    """The oracle's search over the FP32 sets of units; `best` is the best passing set seen (None: none)."""

    def __init__(self, lab: Lab, max_evals: int | None) -> None:
        self.lab, self.max_evals = lab, max_evals
        n = len(lab.units)
        self.heavy = [u for u in range(n) if lab.unit_flops[u] > 0]
        self.free = frozenset(u for u in range(n) if lab.unit_flops[u] == 0)
        self.all_fp32 = self.free | frozenset(self.heavy)
        self.best: frozenset[int] | None = None

    def passes(self, fp32: frozenset[int]) -> bool:
        idx = frozenset(i for n in fp32 for i in self.lab.units[n])
        if idx not in self.lab.metrics and self.max_evals is not None and self.lab.evals >= self.max_evals:
            raise _Budget
        ok = self.lab.run(fp32)[0]
        if ok and (self.best is None or self.flops_low(fp32) > self.flops_low(self.best)):
            self.best = fp32
        return ok

    def flops_low(self, fp32: frozenset[int]) -> int:
        return sum(self.lab.unit_flops[u] for u in self.heavy if u not in fp32)

    def prefix(self, order: list[int]) -> frozenset[int]:
        """Bisection for the longest prefix of `order` that can run low (the rest FP32) and pass."""
        lo, hi = 0, len(order)  # the prefix of length lo passes (0: every FLOP unit FP32, which passed)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.passes(self.all_fp32 - frozenset(order[:mid])):
                lo = mid
            else:
                hi = mid - 1
        return self.all_fp32 - frozenset(order[:lo])

    def climb(self, fp32: frozenset[int]) -> frozenset[int]:
        """Greedy from a passing set: lower one more unit (heaviest first), else swap a lowered unit for a
        heavier FP32 one, until no single change improves the share."""
        w = self.lab.unit_flops
        while True:
            lowered = True
            while lowered:  # not monotone: a unit that failed before may pass once others moved
                lowered = False
                for u in sorted((u for u in self.heavy if u in fp32), key=lambda u: -w[u]):
                    if self.passes(fp32 - {u}):
                        fp32, lowered = fp32 - {u}, True
            swapped = False
            for b in sorted((u for u in self.heavy if u in fp32), key=lambda u: -w[u]):
                for a in sorted((u for u in self.heavy if u not in fp32), key=lambda u: w[u]):
                    if w[a] >= w[b]:
                        break
                    if self.passes((fp32 - {b}) | {a}):
                        fp32, swapped = (fp32 - {b}) | {a}, True
                        break
                if swapped:
                    break
            if not swapped:
                return fp32

    def run(self, start: frozenset[int] | None) -> list[str]:
        starts: list[frozenset[int]] = []
        try:
            if self.passes(self.all_fp32):
                drops = {u: self.lab.run(self.all_fp32 - {u})[1] for u in self.heavy}  # each unit alone low
                w = self.lab.unit_flops
                by_ratio = sorted(self.heavy, key=lambda u: (max(drops[u], 0.0) / w[u], -w[u]))
                by_drop = sorted(self.heavy, key=lambda u: (max(drops[u], 0.0), -w[u]))
                starts += [self.prefix(by_ratio), self.prefix(by_drop), self.all_fp32]
            if start is not None and self.passes(start | self.free):
                starts.append(start | self.free)
            for s in starts:
                self.climb(s)
        except _Budget:
            return [f"oracle stopped at its cap of {self.max_evals} evaluations"]
        return [] if starts else ["no plan passes: every FLOP unit in FP32 fails the target"]


def best_plan(build: Callable[[], Any], evaluate: Callable[[Any], Any], example_inputs: Any,
              options: TuneOptions, *, start: Iterable[OpInstance] | None = None,
              max_evals: int | None = None) -> OracleResult:
    """The plan with the highest lower-precision FLOP share that meets the target (see the module docstring)."""
    lab = Lab(build, evaluate, example_inputs, options)
    low_passed, _ = lab.run(())
    low_metric = lab.metric(())
    start_units = None
    if start is not None:
        wanted = {c.label() for c in start}
        start_units = frozenset(n for n, u in enumerate(lab.units)
                                if any(lab.found.instances[i].label() in wanted for i in u))
    search = _Search(lab, max_evals)
    notes = search.run(start_units)
    best = search.best
    fp32 = None if best is None else lab.fp32_of(best)
    return OracleResult(share=None if best is None else lab.share(best), fp32=fp32,
                        metric=None if best is None else lab.metric(best), target=lab.accept.target,
                        baseline=lab.base.value, evals=lab.evals, units=len(lab.units),
                        flop_units=sum(f > 0 for f in lab.unit_flops), candidates=len(lab.found),
                        plan=None if fp32 is None else plan_for(lab.session.options, lab.found, fp32),
                        all_low_metric=low_metric, all_low_passed=low_passed, notes=notes)


def mpt_share(result: Any) -> float | None:
    """The lower-precision FLOP share of the trial mpt chose (the same measure as the oracle's), None: not met."""
    if result.chosen is None:
        return None
    return result.trials[result.chosen - 1].shares.flop_share


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="an mpt model file: build_model(), evaluate(model), example_inputs()")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--tolerance", type=float, default=0.01)
    ap.add_argument("--absolute", action="store_true")
    ap.add_argument("--lower-is-better", action="store_true")
    ap.add_argument("--max-evals", type=int, default=None, help="cap on the oracle's evaluations")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(args.model).resolve().parent))  # as `mpt tune` does: the file's own imports
    mod = types.SimpleNamespace(**runpy.run_path(args.model))
    opts = TuneOptions(dtype=args.dtype, tolerance=args.tolerance, absolute=args.absolute,
                       lower_is_better=args.lower_is_better)
    inputs = getattr(mod, "example_inputs", None)
    res = tune(mod.build_model, mod.evaluate, inputs, opts)
    mine = mpt_share(res)
    orc = best_plan(mod.build_model, mod.evaluate, inputs, opts, max_evals=args.max_evals,
                    start=res.plan.fp32_instances if mine is not None else None)
    print(f"mpt: {res.evals} evals, share {mine}; oracle: {orc.evals} evals, share {orc.share}")
    if mine is not None and orc.share:
        print(f"ratio mpt/oracle: {mine / orc.share:.3f}")


if __name__ == "__main__":
    main()

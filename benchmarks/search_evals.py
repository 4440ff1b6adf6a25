"""Search cost: full evaluations used to find the op instances that must stay FP32.

    .venv/bin/python benchmarks/search_evals.py [--placements 30] [--seed 0] [--quick]

Table 1 (real evaluations). Planted models `tuner.testing.PlantedTask(N, k)`
with N linear op instances (the candidates), k of them fragile, N in
{16, 64, 256} and k in {1, 2, 4}. Every method is run against the SAME
evaluate (agreement with the FP32 predictions, tolerance 1% relative) and
every count includes the FP32 baseline evaluation:

  mpt tune      tuner.tune(..., TuneOptions(dtype="bf16", tolerance=0.01)):
                baseline, then PrecisionSearch over the instances ranked by cheap forward passes.
  INC 2.x       reference of neural_compressor/strategy/auto_mixed_precision.py (quant_level "auto"):
                baseline, all-low, each op type alone to FP32, each instance alone to FP32
                (recording the metric), then accumulated fallback in the order of that metric.
                Stops at the first trial that meets the target (timeout=0, the default);
                max_trials=100 (trials, not counting the baseline); a config already
                evaluated is skipped, as INC's tuning history does. A planted model has one op
                type (linear), so the op-type stage tries "every linear in FP32", which passes.
  INC op-wise   the same with quant_level=1 (no op-type stage): the per-instance search.
  onnx halving  reference of onnxconverter_common/auto_mixed_precision.py: segments in execution
                order; try converting the largest untested segment while every node not yet proven
                good stays FP32; pass marks it good, failure halves it (size-1 failure: bad); then
                one final validation run of the result, as that code does.

A trial runs the model under Plan(dtype="bf16", preset="torch-cpu",
fp32_instances=...) attached with engine="python" (what tune.py does).
Candidates are `result.candidates` from the mpt run. "FP32" is the number of
instances the method leaves in FP32 (share = FP32 / N); "exact" says whether
that set is exactly the planted fragile ops.

Table 2 (oracle). PrecisionSearch run directly with an uninformative ranking
(fragile ops at random positions of the ranking) and the oracle
test = lambda fp32: fragile <= fp32; worst and mean evaluations over
--placements random placements, +1 for the baseline, next to the target
k*ceil(log2(N/k))+3 (baseline and all-low included). Two score patterns:
all scores equal, and i.i.d. uniform random scores (no gap either way).
"lower bound, any search" is the information-theoretic worst case of any
adaptive pass/fail search that does not know k exactly:
ceil(log2(sum_{j<=k} C(N, j))) + 1; where it exceeds the target, no
algorithm can meet the target on every placement.

Targets: mpt evals <= k*ceil(log2(N/k))+4; mpt evals <= 5 when its ranking
puts the fragile ops first (mpt's counts include the baseline's second run,
which tells a deterministic evaluate from a noisy one; the references run the
baseline once); mpt never leaves more FP32 instances than a
reference that met the target.
"""
from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from itertools import groupby
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_line, pass_fail, table  # noqa: E402

import torch  # noqa: E402

import tuner  # noqa: E402
from tuner.policy.plan import OpInstance, Plan  # noqa: E402
from tuner.search.noise import Acceptance  # noqa: E402
from tuner.search.strategy import PrecisionSearch  # noqa: E402
from tuner.testing import PlantedTask  # noqa: E402
from tuner.options.tune import TuneOptions  # noqa: E402
from tuner.search.session import tune  # noqa: E402

NS = (16, 64, 256)
KS = (1, 2, 4)
OPTIONS = TuneOptions(dtype="bf16", tolerance=0.01)
INC_MAX_TRIALS = 100


def bound(n: int, k: int) -> int:
    return k * math.ceil(math.log2(n / k)) + 4  # + the baseline's second run (tuner.search.noise)


def lower_bound(n: int, k: int) -> int:
    """Worst-case evaluations ANY adaptive search needs (baseline included), fragile count unknown but <= k.

    Each pass/fail test halves the hypotheses at best; there are sum_{j<=k} C(n, j)
    possible fragile sets, so ceil(log2 of that) tests, plus the baseline.
    """
    return math.ceil(math.log2(sum(math.comb(n, j) for j in range(k + 1)))) + 1


class Trials:
    """Evaluates FP32 sets of candidate instances on one model; counts full evaluations."""

    def __init__(self, task: PlantedTask, candidates: list[OpInstance]) -> None:
        self.task = task
        self.model = task.build()
        self.candidates = candidates
        self.count = 0
        self.baseline = self._evaluate_fp32()
        self.target = OPTIONS.target(self.baseline)

    def _evaluate_fp32(self) -> float:
        self.count += 1
        return self.task.evaluate(self.model)

    def metric(self, fp32: frozenset[OpInstance]) -> float:
        plan = Plan(dtype="bf16", preset="torch-cpu", fp32_instances=tuple(sorted(fp32)))
        tuner.attach(self.model, plan, engine="python")
        try:
            self.count += 1
            return self.task.evaluate(self.model)
        finally:
            tuner.detach(self.model)

    def passes(self, metric: float) -> bool:
        return Acceptance(self.target, 0.0, OPTIONS.lower_is_better).confirms(metric)


def inc_reference(trials: Trials, *, op_type_stage: bool) -> frozenset[OpInstance] | None:
    """INC 2.x auto_mixed_precision: returns the FP32 set of the first passing trial (None: none passed)."""
    cands = trials.candidates
    history: dict[frozenset[OpInstance], float] = {}
    state = {"trials": 0, "last": math.nan}

    def trial(fp32: frozenset[OpInstance]) -> bool:
        """True when tuning stops here (target met); raises StopIteration at max_trials."""
        state["trials"] += 1
        if fp32 in history and state["trials"] < INC_MAX_TRIALS:
            state["last"] = history[fp32]  # "Find evaluated tuning config, skip."
            return False
        metric = trials.metric(fp32)
        history[fp32] = metric
        state["last"] = metric
        if trials.passes(metric):
            return True
        if state["trials"] >= INC_MAX_TRIALS:
            raise StopIteration
        return False

    try:
        if trial(frozenset()):  # step 1: everything that supports bf16 in bf16
            return frozenset()
        fallback = cands[::-1]  # INC walks the lower-precision items in reverse
        if op_type_stage:
            by_type = sorted(fallback, key=lambda c: c.op)
            for _op, group in groupby(by_type, key=lambda c: c.op):
                fp32 = frozenset(group)
                if trial(fp32):
                    return fp32
        impact: dict[OpInstance, float] = {}
        for c in fallback:  # each instance alone back to FP32
            if trial(frozenset([c])):
                return frozenset([c])
            impact[c] = state["last"]
        ordered = sorted(impact, key=lambda c: impact[c], reverse=not OPTIONS.lower_is_better)
        acc: set[OpInstance] = set()
        for c in ordered:  # accumulated fallback
            acc.add(c)
            if trial(frozenset(acc)):
                return frozenset(acc)
    except StopIteration:
        return None
    return None


class _Segment:
    def __init__(self, size: int) -> None:
        self.size, self.next, self.good, self.bad = size, None, False, False

    def split(self) -> None:
        half = self.size // 2
        new = _Segment(self.size - half)
        new.next, self.next, self.size = self.next, new, half


def onnx_reference(trials: Trials) -> frozenset[OpInstance] | None:
    """onnxconverter-common's SegmentList search; FP32 set of the final model (None: final validation failed)."""
    nodes = trials.candidates
    first = _Segment(len(nodes))

    def largest() -> _Segment | None:
        best, cur = None, first
        while cur is not None:
            if not cur.good and not cur.bad and (best is None or cur.size > best.size):
                best = cur
            cur = cur.next
        return best

    def blocked(skip: _Segment | None = None) -> frozenset[OpInstance]:
        out, i, cur = [], 0, first
        while cur is not None:
            if cur is not skip and not cur.good:
                out.extend(nodes[i:i + cur.size])
            i += cur.size
            cur = cur.next
        return frozenset(out)

    while (seg := largest()) is not None:
        if trials.passes(trials.metric(blocked(seg))):
            seg.good = True
        elif seg.size == 1:
            seg.bad = True
        else:
            seg.split()
    final = blocked()
    return final if trials.passes(trials.metric(final)) else None


def table1(seed: int, ns: tuple[int, ...], ks: tuple[int, ...]) -> list[dict]:
    rows, records = [], []
    for n in ns:
        for k in ks:
            task = PlantedTask(n, k, seed)
            planted = task.build().fragile_labels()
            before = task.evaluations
            result = tune(task.build, task.evaluate, task.example_inputs, OPTIONS)
            assert task.evaluations - before == result.evals, "tune's count differs from evaluate calls"
            cands = list(result.candidates)
            assert len(cands) == n, f"expected {n} candidates, found {len(cands)}"
            ranked = sorted(result.scores, key=lambda lbl: -result.scores[lbl])
            ranking_first = set(ranked[:k]) == planted
            mpt_fp32 = {i.label() for i in result.plan.fp32_instances} if result.status == "ok" else None
            rec = {"n": n, "k": k, "ranking_first": ranking_first,
                   "mpt": (result.evals, mpt_fp32, result.seconds)}
            for name, run in (("INC 2.x", lambda t: inc_reference(t, op_type_stage=True)),
                              ("INC op-wise", lambda t: inc_reference(t, op_type_stage=False)),
                              ("onnx halving", onnx_reference)):
                t0 = time.monotonic()
                trials = Trials(task, cands)
                fp32 = run(trials)
                rec[name] = (trials.count, None if fp32 is None else {i.label() for i in fp32},
                             time.monotonic() - t0)
            records.append(rec)
            for name in ("mpt", "INC 2.x", "INC op-wise", "onnx halving"):
                evals, fp32, secs = rec[name]
                if fp32 is None:
                    rows.append([n, k, name, evals, "-", "-", "target not met", f"{secs:.1f}"])
                else:
                    rows.append([n, k, name, evals, len(fp32), f"{len(fp32) / n:.1%}",
                                 "yes" if fp32 == planted else "no", f"{secs:.1f}"])
            print(f"  done N={n} k={k}", file=sys.stderr)
    print("\n### Table 1: full evaluations on planted models (baseline included), same evaluate for all\n")
    print(table(["N", "k", "method", "evals", "FP32", "FP32 share", "exact planted set", "seconds"], rows))
    return records


def table2(placements: int, seed: int, ns: tuple[int, ...], ks: tuple[int, ...]) -> list[tuple]:
    rng = random.Random(seed)
    rows, checks = [], []
    for n in ns:
        for k in ks:
            for pattern in ("equal scores", "uniform random scores"):
                counts, wrong = [], 0
                for _ in range(placements):
                    ranked = list(range(n))
                    rng.shuffle(ranked)
                    fragile = frozenset(rng.sample(range(n), k))
                    scores = [1.0] * n if pattern == "equal scores" else sorted(
                        (rng.random() for _ in range(n)), reverse=True)
                    by_item = [scores[ranked.index(i)] for i in range(n)]  # item i sits at ranked.index(i)
                    out = PrecisionSearch(by_item, lambda fp32: fragile <= fp32, thorough=True).run()
                    counts.append(out.evals + 2)  # + the FP32 baseline's two runs
                    wrong += out.fp32 != fragile
                worst, target = max(counts), bound(n, k)
                rows.append([n, k, pattern, worst, f"{statistics.mean(counts):.1f}", target,
                             pass_fail(worst <= target), lower_bound(n, k), f"{wrong}/{placements}"])
                checks.append((n, k, pattern, worst, target))
    print(f"\n### Table 2: PrecisionSearch --thorough with an uninformative ranking, oracle test, "
          f"{placements} random placements (baseline included)\n")
    print(table(["N", "k", "scores", "worst evals", "mean evals", "target k*ceil(log2(N/k))+3", "worst <= target",
                 "lower bound, any search", "wrong FP32 set"], rows))
    return checks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--placements", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0, help="PlantedTask seed (table 1) and placement seed (table 2)")
    ap.add_argument("--quick", action="store_true", help="N in {16, 64} only, 10 placements")
    args = ap.parse_args()
    ns = NS[:2] if args.quick else NS
    if args.quick:
        args.placements = 10
    torch.manual_seed(0)
    print("## search_evals: evaluations to find the FP32 fallbacks (planted models)")
    print(machine_line())
    records = table1(args.seed, ns, KS)
    checks = table2(args.placements, args.seed, ns, KS)

    rows = []
    for r in records:
        n, k = r["n"], r["k"]
        evals, fp32, _ = r["mpt"]
        rows.append([f"N={n} k={k}: mpt evals <= {bound(n, k)}", evals, pass_fail(evals <= bound(n, k))])
        if r["ranking_first"]:
            rows.append([f"N={n} k={k}: ranking puts the fragile ops first -> mpt evals <= 5", evals,
                         pass_fail(evals <= 5)])
        else:
            rows.append([f"N={n} k={k}: ranking did NOT put the fragile ops first (<= 5 not applicable)", evals,
                         "n/a"])
        met = [(name, r[name][1]) for name in ("INC 2.x", "INC op-wise", "onnx halving") if r[name][1] is not None]
        fewest = min((len(s) for _, s in met), default=None)
        mine = None if fp32 is None else len(fp32)
        ok = mine is not None and (fewest is None or mine <= fewest)
        rows.append([f"N={n} k={k}: mpt FP32 ({mine}) <= fewest of references that met the target ({fewest})",
                     mine, pass_fail(ok)])
    for n, k, pattern, worst, target in checks:
        rows.append([f"oracle N={n} k={k} {pattern}: worst evals <= {target}", worst, pass_fail(worst <= target)])
    print("\n### Targets\n")
    print(table(["target", "measured", "result"], rows))


if __name__ == "__main__":
    main()

"""PrecisionSearch on oracles: both regimes within the evaluation bound, cost-aware, thorough proves."""
import math
import random

import pytest

from tuner.search.strategy import PrecisionSearch, Probe, search_order


def spread_out(n: int, seed: int, p: float, frac: float = 0.3, rank_noise: float = 0.5):
    """Many small contributors: errors add in quadrature, the metric drop grows like error^p."""
    rng = random.Random(seed)
    true = [rng.lognormvariate(0, 1) for _ in range(n)]
    scores = [t * rng.lognormvariate(0, rank_noise) for t in true]
    costs = [rng.choice([1e3, 1e6, 4e6]) for _ in range(n)]
    allowed = math.sqrt(sum(t * t for t in true)) * frac

    def test(fp32):
        residual = math.sqrt(sum(true[i] ** 2 for i in range(n) if i not in fp32))
        drop = (residual / allowed) ** p
        return Probe(drop <= 1.0, drop)

    return scores, costs, test


@pytest.mark.parametrize("n", [44, 140, 433])
@pytest.mark.parametrize("p", [1.0, 2.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_spread_out_sensitivity_within_log2_bound(n, p, seed):
    scores, costs, test = spread_out(n, seed, p)
    first = test(frozenset())
    assert not first.passed
    out = PrecisionSearch(scores, test, costs=costs, all_low_failed=True, all_low_drop=first.drop).run()
    # session adds 3: the baseline twice and the all-low trial; the target is ceil(log2 N) + 4 in all
    assert out.evals + 3 <= math.ceil(math.log2(n)) + 4
    assert out.fp32 is not None and test(out.fp32).passed
    # the cut is tight: one instance fewer (the last one of the prefix) fails
    assert len(out.fp32) < n


def test_cost_aware_order_keeps_heavy_ops_low():
    # two ops with the same error: the cheap one goes to FP32 first
    order, gap = search_order([1.0, 1.0, 0.1], [1e6, 1e3, 1e3])
    assert gap is None and order[0] == 1


def test_few_fragile_ops_cost_two_probes():
    n, fragile = 50, {7, 31}
    scores = [1000.0 if i in fragile else 1.0 + i * 0.01 for i in range(n)]
    calls = []

    def test(fp32):
        calls.append(fp32)
        return fragile <= fp32

    out = PrecisionSearch(scores, test, all_low_failed=True).run()
    assert out.fp32 == frozenset(fragile) and len(calls) == 2 and out.trusted_gap


def test_bound_holds_even_when_the_drops_mislead():
    rng = random.Random(3)
    n, cut = 200, 137

    def test(fp32):
        passed = len(fp32) >= cut
        return Probe(passed, rng.uniform(0.01, 50))  # drops that say nothing

    out = PrecisionSearch([1.0] * n, test, all_low_failed=True, all_low_drop=30.0).run()
    assert out.evals <= math.ceil(math.log2(n)) + 1
    # exact up to the instances the search may leave undecided (under 1% of the cost)
    assert out.fp32 is not None and cut <= len(out.fp32) <= cut + n // 100


def test_thorough_finds_a_misranked_fragile_op():
    n, bad = 64, 63  # uninformative ranking: the fragile op ranks last
    out = PrecisionSearch([1.0] * n, lambda fp32: bad in fp32, thorough=True).run()
    assert out.fp32 == frozenset({bad})


def test_nothing_passes_reports_none():
    out = PrecisionSearch([1.0, 2.0, 3.0], lambda fp32: False, all_low_failed=True).run()
    assert out.fp32 is None and out.evals <= 3


def test_an_overflow_chain_ranked_last_does_not_end_all_fp32_with_probes_left():
    """Units 0 and 7 must stay FP32 (an fp16 chain: every plan lowering either overflows), and the ranking put
    7 last: every prefix but the whole overflows, the cut lands on all FP32, and the fit has no finite point.
    The probes left lower the others, never 0 or 7, rather than give up at all FP32."""
    from tuner.search.guide import Guide

    need = {0, 7}
    scores = [1.0, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05, 1e-9]

    def test(fp32):
        return Probe(need <= fp32, 0.5 if need <= fp32 else math.inf)

    guide = Guide(lambda fp32: 0.001 * (8 - len(fp32)) if need <= fp32 else math.inf)
    out = PrecisionSearch(scores, test, all_low_failed=True, all_low_drop=math.inf, guide=guide).run()
    assert out.fp32 is not None and len(out.fp32) < len(scores)
    assert need <= out.fp32


def test_a_misranked_heavy_unit_does_not_end_all_fp32_with_probes_left():
    """A CNN-like fp16 chain: unit 5 holds most of the cost and must stay FP32 (every plan lowering it
    overflows), the ranking put it last, and each other unit holds under 1% of the cost. The cut lands on all
    FP32, lowering back weighs only unit 5 (the others are too light alone) and cannot lower it: the probes
    left bisect over the units the ranking put last, first, and find the plan with only unit 5 FP32."""
    from tuner.search.guide import Guide

    need = 5
    scores, costs = [1.8, 1.1, 0.51, 0.44, 0.36, 1e-9], [1.0] * 5 + [100.0]
    tested = []

    def test(fp32):
        tested.append(fp32)
        return Probe(need in fp32, 0.5 if need in fp32 else math.inf)

    guide = Guide(lambda fp32: 0.001 * (6 - len(fp32)) if need in fp32 else math.inf)
    search = PrecisionSearch(scores, test, costs=costs, all_low_failed=True, all_low_drop=math.inf, guide=guide)
    out = search.run()
    assert out.fp32 == frozenset({need})
    assert out.evals == len(tested) <= search.budget  # within the bound, and no overflowing plan evaluated
    assert all(need in fp32 for fp32 in tested)
    assert any("bisection" in note for note in out.notes)


def test_a_rescue_the_caller_stops_keeps_the_plan_it_confirmed():
    """The same model under a bound of the caller (--max-evals) that allows one evaluation after the all-FP32
    trial: the rescue's probe is cut short and the confirmed all-FP32 plan stays, never an unconfirmed one."""
    from tuner.search.guide import Guide
    from tuner.search.strategy import SearchStopped

    need, evals = 5, []

    def test(fp32):
        if len(evals) == 2:
            raise SearchStopped("max evals")
        evals.append(fp32)
        return Probe(need in fp32)

    guide = Guide(lambda fp32: 0.001 if need in fp32 else math.inf)
    out = PrecisionSearch([1.8, 1.1, 0.51, 0.44, 0.36, 1e-9], test, costs=[1.0] * 5 + [100.0],
                          all_low_failed=True, all_low_drop=math.inf, guide=guide).run()
    assert out.stopped == "max evals" and out.evals == 3
    assert out.fp32 == evals[-1] and need in out.fp32 and len(out.fp32) < 6  # the last one confirmed: {3, 4, 5}


def test_the_rescue_spends_nothing_where_failed_trials_prove_every_lowerable_unit_needed():
    """An LSTM-like model where only all FP32 passes: lowering back tried units 0 and 2 alone and both failed
    (each is needed), and unit 1 holds under 1% of the cost. No plan the rescue could try is worth a trial:
    it spends none of the probe left (the gauntlet's LSTM tasks stay at their evaluations)."""
    from tuner.search.guide import Guide

    tested = []

    def test(fp32):
        tested.append(fp32)
        return Probe(len(fp32) == 3, 0.0 if len(fp32) == 3 else 2.0)

    guide = Guide(lambda fp32: 0.01 * (3 - len(fp32)) + (0.0 if len(fp32) == 3 else 1.0))
    search = PrecisionSearch([3.0, 2.0, 1.0], test, costs=[100.0, 1.0, 10.0], all_low_failed=True,
                             all_low_drop=2.0, guide=guide, extra_probes=2)
    out = search.run()
    assert out.fp32 == frozenset({0, 1, 2}) and search._left() == 1
    assert sorted(map(sorted, tested)) == [[0, 1], [0, 1, 2], [1, 2]]

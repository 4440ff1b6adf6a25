"""The search's guide: observed output errors order the search, spare uninformative probes, and lower back."""
import math
import random

import pytest

from tuner.search.calibration import ErrorModel
from tuner.search.guide import Guide
from tuner.search.strategy import PrecisionSearch, Probe


def quadrature(true, allowed, p=2.0):
    """An oracle whose output error is the quadrature sum of the true errors left low, and the metric's drop
    (error / allowed)^p: the guide sees `error` exactly, the search only the (misleading) scores."""
    def error(fp32):
        return math.sqrt(sum(t * t for i, t in enumerate(true) if i not in fp32))

    def test(fp32):
        drop = (error(fp32) / allowed) ** p
        return Probe(drop <= 1.0, drop)

    return error, test


def test_a_ranking_that_does_not_predict_is_replaced_by_observed_effects():
    rng = random.Random(0)
    n = 40
    true = [rng.lognormvariate(0, 1) for _ in range(n)]
    scores = [1.0 / t for t in true]  # the ranking is backwards: it puts the harmless units first
    error, test = quadrature(true, allowed=0.5 * math.sqrt(sum(t * t for t in true)))
    probes = []

    def counted(fp32):
        probes.append(fp32)
        return test(fp32)

    first = test(frozenset())
    search = PrecisionSearch(scores, counted, all_low_failed=True, all_low_drop=first.drop, predict=error)
    out = search.run()
    assert any("did not predict" in note for note in out.notes)
    assert out.fp32 is not None and test(out.fp32).passed
    # the units kept FP32 are the ones that matter: the largest true errors
    kept = sorted(out.fp32, key=lambda i: -true[i])
    assert set(kept) <= set(sorted(range(n), key=lambda i: -true[i])[: len(kept) + 2])
    assert out.evals + 3 <= math.ceil(math.log2(n)) + 4
    # the same backwards ranking without the guide: more FP32 kept for the same target
    blind = PrecisionSearch(scores, test, all_low_failed=True, all_low_drop=first.drop).run()
    assert blind.fp32 is not None and len(blind.fp32) > len(out.fp32)


def test_no_evaluation_is_spent_on_a_prefix_predicted_equal_to_the_failed_all_low_plan():
    true = [0.0] * 20 + [1.0] * 10  # the first 20 in the order change nothing: their prefixes fail like all-low
    scores = [2.0] * 20 + [1.0] * 10
    error, test = quadrature(true, allowed=math.sqrt(3.0))
    tested = []

    def counted(fp32):
        tested.append(fp32)
        return test(fp32)

    first = test(frozenset())
    out = PrecisionSearch(scores, counted, all_low_failed=True, all_low_drop=first.drop, predict=error).run()
    assert out.fp32 is not None and test(out.fp32).passed
    assert all(len(fp32 & set(range(20, 30))) > 0 for fp32 in tested)  # never a prefix of the no-op units alone
    assert error(out.fp32) <= math.sqrt(3.0)


def test_overflowing_plans_are_never_evaluated():
    n = 24
    true = [0.1] * n

    def error(fp32):
        return math.inf if 5 not in fp32 else math.sqrt(sum(0.01 for i in range(n) if i not in fp32))

    def test(fp32):
        e = error(fp32)
        drop = math.inf if math.isinf(e) else (e / 0.3) ** 2
        return Probe(drop <= 1.0, drop)

    tested = []

    def counted(fp32):
        tested.append(fp32)
        return test(fp32)

    scores = [1.0] * n  # the ranking does not know which one overflows
    out = PrecisionSearch(scores, counted, all_low_failed=True, all_low_drop=math.inf, predict=error).run()
    assert all(5 in fp32 for fp32 in tested)
    assert out.fp32 is not None and 5 in out.fp32 and test(out.fp32).passed
    assert true  # the error model: every unit adds the same


def test_lowering_back_goes_in_blocks_the_fit_predicts_safe():
    # a cheap fragile unit and many heavy harmless ones, ranked so that the cut sweeps heavy ones in
    n = 20
    true = [3.0] + [0.05] * (n - 1)
    scores = [1.0] * n
    costs = [1.0] + [100.0] * (n - 1)
    error, test = quadrature(true, allowed=1.0)
    first = test(frozenset())
    out = PrecisionSearch(scores, test, costs=costs, all_low_failed=True, all_low_drop=first.drop,
                          predict=error).run()
    assert out.fp32 is not None and 0 in out.fp32 and test(out.fp32).passed
    assert len(out.fp32) <= 3  # the heavy harmless units went back to the lower precision


def test_guide_memoizes_and_interpolates_long_orders():
    calls = []

    def predict(fp32):
        calls.append(fp32)
        return 1.0 - len(fp32) / 200

    guide = Guide(predict)
    errors = guide.prefix_errors(list(range(200)))
    assert len(errors) == 201 and guide.forwards == len(calls) <= 64
    assert errors[0] == 1.0 and errors[200] == 0.0
    assert all(abs(errors[k] - (1.0 - k / 200)) < 1e-9 for k in range(201))  # linear between samples
    guide.error(frozenset())
    assert guide.forwards == len(calls)  # asked again: not run again


def test_error_model_fits_the_exponent_of_the_measured_points():
    model = ErrorModel([1.0] * 4)
    model.observe_error(1.0, 4.0)
    model.observe_error(0.5, 1.0)  # drop ~ error^2
    assert abs(model.exponent() - 2.0) < 1e-9
    assert abs(model.predicted_drop(0.25) - 0.25) < 1e-9
    assert model.predicted_drop(math.inf) == math.inf
    assert ErrorModel([1.0]).predicted_drop(0.5) is None  # nothing measured yet


def test_a_real_tune_is_guided_and_reports_only_evaluated_plans():
    import torch
    from torch import nn

    from tuner.search.session import tune

    torch.manual_seed(0)
    x = torch.randn(64, 32)

    def build():
        torch.manual_seed(1)
        return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.LayerNorm(64),
                             nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 10)).eval()

    ref = build()(x).detach()

    def evaluate(model):  # the output's relative error, lower is better
        with torch.no_grad():
            return float((model(x) - ref).norm() / ref.norm())

    result = tune(build, evaluate, (x[:16],), dtype="bf16", tolerance=3e-3, absolute=True, lower_is_better=True)
    assert result.trials[1].metric > 3e-3  # all-low fails: the search has to decide
    assert result.metric is not None and result.metric <= result.target
    assert any("guided the search" in note for note in result.notes)
    chosen = result.trials[result.chosen - 1]  # the plan is a trial's set, less overrides that change nothing
    assert chosen.passed and not chosen.baseline and chosen.metric == result.metric
    assert {i.label() for i in result.plan.fp32_instances} <= set(chosen.fp32)


def test_a_plan_already_measured_costs_no_probe_and_lowering_back_moves_on():
    """The cut saw prefix k-1 fail; lowering back from prefix k proposes that very set first (its last unit
    is the one the fit likes best). It is answered from memory, the unit is refused, and the bound's probes
    go to plans not measured yet (a tune on a gauntlet task stopped with one evaluation unspent)."""
    n = 12
    true = [1.0, 0.9] + [0.05] * (n - 2)
    costs = [100.0, 1.0] + [100.0] * (n - 2)
    error, oracle = quadrature(true, allowed=0.5)
    calls: list[frozenset] = []

    def test(fp32):
        calls.append(fp32)
        return oracle(fp32)

    first = oracle(frozenset())
    search = PrecisionSearch([1.0] * n, test, costs=costs, all_low_failed=True, all_low_drop=first.drop,
                             predict=error, extra_probes=3)
    out = search.run()
    assert len(calls) == len(set(calls)) == out.evals  # no set evaluated twice; the count is the evaluations
    assert search.results.keys() == set(calls)
    assert out.fp32 is not None and {0, 1} <= out.fp32 and oracle(out.fp32).passed
    again = search.test(frozenset(calls[0]))  # asked again: from memory, not counted
    assert again == search.results[calls[0]] and search.count == out.evals and len(calls) == out.evals


def test_probes_left_go_to_a_trade_of_equally_heavy_units():
    """Gauntlet task d019: the cut kept heavy unit 0 FP32 and left the more fragile unit 1, as heavy, low.
    Lowering unit 0 or unit 2 back alone fails; with probes left, the trade brings unit 1 back and sends
    units 0 and 2 down: a cheaper plan that passes."""
    true = [0.5, 0.8, 0.5, 0.05, 0.05]
    costs = [100.0, 100.0, 10.0, 1.0, 1.0]
    error, oracle = quadrature(true, allowed=0.9)
    calls: list[frozenset] = []

    def test(fp32):
        calls.append(fp32)
        return oracle(fp32)

    search = PrecisionSearch([1.0] * 5, test, costs=costs, all_low_failed=True,
                             all_low_drop=oracle(frozenset()).drop, predict=error, extra_probes=4)
    keep = frozenset({0, 2, 3, 4})
    assert search.test(keep).passed  # the plan the cut found
    search._lower_guided(sorted(keep))
    assert frozenset({0, 3, 4}) in calls and frozenset({2, 3, 4}) in calls  # each heavy one alone: fails
    assert calls[-1] == frozenset({1, 3, 4}) and search.best == frozenset({1, 3, 4})  # the trade, passed
    assert len(calls) == len(set(calls))


def test_a_guide_with_its_forwards_spent_lets_the_search_finish_without_it():
    """A large model's guide has a budget of forwards (tuner.search.budget). Spent while lowering back, the
    search goes on from the last plan that passed, lowering the heaviest FP32 units one at a time: every
    forward within the budget, every probe within the bound, and the plan one an evaluation passed."""
    from tuner.search.guide import GuideSpent

    n = 20
    true = [3.0] + [0.05] * (n - 1)  # as in the blocks test above: heavy harmless units swept in by the cut
    costs = [1.0] + [100.0] * (n - 1)
    error, test = quadrature(true, allowed=1.0)
    first = test(frozenset())
    calls: list[frozenset] = []

    def counted(fp32):
        calls.append(fp32)
        return error(fp32)

    budget = 4  # the unlimited guide runs 6 forwards here
    guide = Guide(counted, max_prefixes=4, max_units=2, max_forwards=budget)
    search = PrecisionSearch([1.0] * n, test, costs=costs, all_low_failed=True, all_low_drop=first.drop,
                             guide=guide, extra_probes=4)
    out = search.run()
    assert len(calls) == guide.forwards <= budget
    assert any("forwards were spent" in note for note in out.notes)
    assert out.fp32 is not None and 0 in out.fp32 and test(out.fp32).passed
    assert out.evals <= math.ceil(math.log2(n)) + 4
    with pytest.raises(GuideSpent):
        guide.error(frozenset({1, 2, 3}))  # a plan not seen before: no forward left
    assert guide.error(frozenset()) == error(frozenset())  # one seen before: still known


def test_lowering_back_never_offers_a_plan_that_overflows_and_works_without_a_fit():
    """An error model whose only point overflowed (drop inf) fits nothing: the guide used to offer exactly the
    unit whose lowering overflows (predicted inf, the only prediction it had); now the finite one goes."""
    errors = {frozenset({0, 1, 2}): 0.0, frozenset({1, 2}): math.inf, frozenset({0, 2}): 0.01,
              frozenset({0, 1}): 0.02}
    guide = Guide(lambda fp32: errors[fp32])
    model = ErrorModel([1.0, 0.5, 0.1])
    model.observe(0, math.inf)
    assert guide.safe_block(model, frozenset({0, 1, 2}), [0, 1, 2]) == [1]


def _most_low(true, costs, allowed):
    """The largest cost share that can run low with the quadrature error within `allowed` (0/1 knapsack over
    the squared errors, rounded up onto a grid of 4000 steps: every plan it counts passes)."""
    grid = 4000
    cap, dp = grid, [0.0] * (grid + 1)
    for t, c in zip(true, costs):
        w = math.ceil(t * t / allowed ** 2 * grid)
        for room in range(cap, w - 1, -1):
            dp[room] = max(dp[room], dp[room - w] + c)
    return dp[cap] / sum(costs)


def test_spread_loss_ranked_by_rough_estimates_reaches_the_best_plan_by_measuring_each_unit_alone():
    """Issue 46: spread precision loss (no unit stands out, all-low misses the target by about 40% of the
    allowed drop) with a ranking whose first-order estimates are off by up to 2x either way, units of three
    costs. Measuring each unit alone with the guide (one cheap forward each) orders the cut by the real errors
    per unit of cost: every plan reaches >= 0.95x the most that can run low, 0.99x on average; ordered by
    the estimates the worst was 0.92x and the mean 0.98x. (No bf16 kernel runs: the same on every CPU.)"""
    ratios, notes = [], []
    for seed in range(20):
        rng = random.Random(seed)
        n = 24
        true = [rng.lognormvariate(0, 0.5) for _ in range(n)]
        costs = [rng.choice([1.0, 4.0, 16.0]) for _ in range(n)]
        scores = [t * math.exp(rng.uniform(-math.log(2), math.log(2))) for t in true]
        allowed = 0.85 * math.sqrt(sum(t * t for t in true))  # all-low's drop: (1 / 0.85)^2 = 1.38 allowed
        error, test = quadrature(true, allowed)
        search = PrecisionSearch(scores, test, costs=costs, all_low_failed=True,
                                 all_low_drop=test(frozenset()).drop, predict=error, extra_probes=3)
        out = search.run()
        assert out.fp32 is not None and test(out.fp32).passed
        assert out.evals + 1 <= math.ceil(math.log2(n)) + 4  # + the all-low trial
        ratios.append((1 - sum(costs[i] for i in out.fp32) / sum(costs)) / _most_low(true, costs, allowed))
        notes.extend(out.notes)
    assert min(ratios) >= 0.95 and sum(ratios) / len(ratios) >= 0.99, ratios
    assert sum("measured alone" in note for note in notes) == 20


def test_a_real_tune_near_the_target_measures_each_unit_alone():
    """The session's search, on a residual MLP whose bf16 error is spread over 8 linears, with a target the
    all-low plan misses by a fifth of the allowed error (measured here, so any CPU's bf16 kernels): the guide
    measures each unit alone before the cut, and the plan it reports passes within the bound."""
    import torch
    from torch import nn

    import tuner
    from tuner.policy.plan import Plan
    from tuner.search.session import tune

    class Residual(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(32, 32) for _ in range(8))

        def forward(self, x):
            for layer in self.layers:
                x = x + torch.tanh(layer(x))
            return x

    def build():
        torch.manual_seed(3)
        return Residual().eval()

    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(4))
    ref = build()(x).detach()

    def evaluate(model):  # the output's relative error, lower is better
        with torch.no_grad():
            return float((model(x) - ref).norm() / ref.norm())

    low = evaluate(tuner.attach(build(), Plan(dtype="bf16")))
    result = tune(build, evaluate, (x[:16],), dtype="bf16", tolerance=low / 1.2, absolute=True,
                  lower_is_better=True)
    assert result.trials[1].metric > result.target  # all-low fails, by a little
    assert any("measured alone" in note for note in result.notes)
    assert result.metric is not None and result.metric <= result.target
    assert result.evals <= math.ceil(math.log2(len(result.candidates))) + 4

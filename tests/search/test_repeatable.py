"""One baseline run for a deterministic evaluate: the all-low trial's signature settles it (tuner.search.repeatable)."""
import random

import numpy as np
import torch

from tuner.options.tune import TuneOptions
from tuner.search.repeatable import RunSignature, repeatable
from tuner.search.session import tune
from tuner.testing import PlantedTask

_MODULE_RNG = random.Random(7)


def _same(evaluate, model, first, second):
    """Two runs of evaluate, fed `first` then `second`: repeatable?"""
    return repeatable(_signature(evaluate, model, *first), _signature(evaluate, model, *second))


def _signature(evaluate, model, *batches):
    sig = RunSignature(evaluate)
    sig.start()
    for b in batches:
        sig.feed((b,), {})
    evaluate(model)
    return sig.finish()


def test_the_signature_sees_the_data_fed_and_the_generators_drawn():
    model = torch.nn.Linear(2, 2)
    x = torch.ones(3, 2)
    quiet = lambda m: 1.0  # noqa: E731
    assert _same(quiet, model, [x], [x.clone()])
    assert not _same(quiet, model, [x], [x + 1])  # other data
    assert not _same(quiet, model, [x], [x.to(torch.bfloat16)])  # other dtype
    assert not _same(quiet, model, [x], [x, x])  # another call
    draws = lambda m: float(torch.rand(()))  # noqa: E731 - torch's global generator moves on
    assert not _same(draws, model, [x], [x])

    def reseeds(m):  # draws, but from the same seed every call: deterministic
        torch.manual_seed(0)
        np.random.seed(0)
        return float(torch.rand(())) + float(np.random.rand())

    torch.manual_seed(1)
    assert _same(reseeds, model, [x], [x])  # the first run starts elsewhere, the second where it ended
    torch.manual_seed(1)
    first = _signature(reseeds, model, x)
    torch.manual_seed(2)  # something else drew in between
    assert repeatable(first, _signature(reseeds, model, x))

    def private(m):  # a generator of its own at module level, invisible to the global states
        return _MODULE_RNG.random()

    assert not _same(private, model, [x], [x])
    local = np.random.default_rng(3)

    def closure(m):  # one it holds in its closure
        return float(local.random())

    assert not _same(closure, model, [x], [x])
    assert not repeatable(None, _signature(quiet, model, x))


def test_a_generator_neither_run_touched_does_not_hide_a_reseeded_one():
    """The all-low trial of a resumed run, in another process than the baseline it is compared with: Python's
    generator (seeded anew by each process) differs between them, untouched by either; torch's, reseeded by
    evaluate, is where the baseline left it (replayed from the journal). Each generator is judged apart."""
    model = torch.nn.Linear(2, 2)
    x = torch.ones(3, 2)

    def reseeds(m):
        torch.manual_seed(0)
        return float(torch.rand(()))

    torch.manual_seed(1)
    random.seed(1)
    baseline = _signature(reseeds, model, x)
    random.seed(2)  # the resumed process; torch's generator as the baseline left it
    assert repeatable(baseline, _signature(reseeds, model, x))


def test_a_traced_forward_leaves_no_signature():
    model = torch.nn.Linear(2, 2)
    sig = RunSignature()
    handle = model.register_forward_pre_hook(lambda mod, args, kwargs: sig.feed(args, kwargs), with_kwargs=True)
    sig.start()
    torch.jit.trace(model, torch.ones(1, 2))
    handle.remove()
    assert sig.finish() is None


def test_a_generator_drawn_by_evaluate_costs_the_baseline_a_second_run():
    """Noise mpt can see: the baseline is measured as before (5 runs), and the all-low trial, judged
    before the noise was known, is judged again with the margin."""
    task = PlantedTask(16, 1)
    rng = random.Random(0)

    def noisy(model):
        return task.evaluate(model) + rng.uniform(-1e-3, 1e-3)

    result = tune(task.build, noisy, task.example_inputs, TuneOptions(tolerance=0.01))
    baselines = [t.n for t in result.trials if t.baseline]
    assert baselines == [1, 3, 4, 5, 6] and result.noise > 0  # trial 2 was the all-low one
    assert result.status == "ok" and all(t.metric > result.target + result.noise for t in result.trials
                                         if t.passed and not t.baseline)


def test_other_data_each_run_costs_the_baseline_a_second_run():
    """A generator evaluate creates anew in each call is out of sight, but the data it picks shows."""
    task = PlantedTask(16, 0)

    def sampled(model):
        pick = np.random.default_rng().permutation(len(task.x))[:400]  # unseeded: other samples each run
        with torch.no_grad():
            model(task.x[pick])
        return task.evaluate(model)

    result = tune(task.build, sampled, task.example_inputs, TuneOptions())
    assert [t.baseline for t in result.trials][:3] == [True, False, True]


def test_a_settled_baseline_leaves_its_evaluation_to_the_search():
    """A deterministic evaluate: one FP32 run, and the search's bound grows by the run saved."""
    task = PlantedTask(48, 3, seed=3)
    result = tune(task.build, task.evaluate, task.example_inputs, TuneOptions())
    assert sum(t.baseline for t in result.trials) == 1 and result.noise == 0
    assert all(t.signature for t in result.trials[:2])  # compared: the baseline and the all-low trial
    assert result.trials[2:] and not any(t.signature for t in result.trials[2:])  # the rest: not hashed
    # exact on any CPU: tuner.testing.PlantedTask
    assert {i.label() for i in result.plan.fp32_instances} == task.build().fragile_labels()


def test_noise_as_large_as_the_tolerance_stops_the_search_after_the_baseline():
    """"no plan can be confirmed" is the end of the search: no evaluation follows the baseline's."""
    task = PlantedTask(16, 1)
    rng = random.Random(0)

    def noisy(model):
        return task.evaluate(model) + rng.uniform(-0.05, 0.05)

    result = tune(task.build, noisy, task.example_inputs, TuneOptions(tolerance=0.01))
    assert any("no plan can be confirmed" in w for w in result.warnings)
    assert result.status != "ok" and result.trials[-1].baseline  # nothing evaluated after the last baseline run
    assert [t.baseline for t in result.trials] == [True, False, True, True, True, True]


def test_two_equal_runs_that_drew_differently_are_not_taken_as_deterministic():
    """A metric seeded from os.urandom in each call: the first two FP32 runs happen to agree, the third does not.
    Two equal values from runs whose signatures differ (they drew from other seeds) are luck, not proof: the
    baseline runs once more before evaluate is called deterministic."""
    task = PlantedTask(8, 0)
    seeds = iter([0, 1, 3, 1, 2, 0, 1, 2, 0, 1])  # baseline 1, all-low trial, baseline 2 (equal to 1), 3, ...

    def urandom(n):  # os.urandom as the evaluate sees it, in this order (torch itself draws from the real one)
        return next(seeds).to_bytes(n, "little")

    def seeded(model):
        seed = int.from_bytes(urandom(4), "little")
        torch.manual_seed(seed)  # the generator ends elsewhere for another seed: the runs' signatures differ
        return task.evaluate(model) + 1e-3 * (seed % 3) + 0 * float(torch.rand(()))

    result = tune(task.build, seeded, task.example_inputs, TuneOptions(tolerance=0.01))
    assert result.noise > 0 and sum(t.baseline for t in result.trials) == 5

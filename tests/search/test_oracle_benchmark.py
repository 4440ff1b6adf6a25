"""benchmarks/oracle.py, the best-known-plan reference: on a planted task its plan meets the target when
deployed, keeps exactly the planted pair FP32, and its FLOP share is at least mpt's."""
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import tuner
from tuner.options.tune import TuneOptions
from tuner.search.session import tune
from tuner.testing import PlantedTask

ORACLE = Path(__file__).resolve().parents[2] / "benchmarks" / "oracle.py"


def _bench_module(name: str):
    """A benchmarks/ script imported as a module (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"mpt_bench_{name}", ORACLE.parent / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _oracle_module():
    return _bench_module("oracle")


def test_oracle_plan_meets_target_and_is_at_least_as_good_as_mpt():
    oracle = _oracle_module()
    task = PlantedTask(8, 2, samples=128)
    options = TuneOptions(dtype="bf16", tolerance=0.01)
    mpt = tune(task.build, task.evaluate, task.example_inputs, options)
    best = oracle.best_plan(task.build, task.evaluate, task.example_inputs, options)

    assert best.fp32 is not None and not best.all_low_passed
    # exact on any CPU: tuner.testing.PlantedTask
    assert {i.label() for i in best.fp32} == task.build().fragile_labels()
    assert best.evals > mpt.evals  # it searched: every unit alone, bisection, greedy moves
    # the plan, deployed as tuner.load deploys it, meets the target
    model = task.build()
    tuner.attach(model, best.plan)
    try:
        assert task.evaluate(model) >= best.target == mpt.target
    finally:
        tuner.detach(model)
    assert 0 < oracle.mpt_share(mpt) <= best.share < 1


def test_gauntlet_fresh_draws_keep_the_model_and_judge_each_plan_on_new_inputs():
    gauntlet = _bench_module("gauntlet")
    task = gauntlet.Task("t", "transformer", "bf16", "cosine", depth=1, width=16, seed=3, overflow=False)
    fresh = task.redraw(0)
    assert not torch.equal(fresh.x, task.x) and not torch.equal(fresh.x, task.redraw(1).x)
    for a, b in zip(task.build().state_dict().values(), fresh.build().state_dict().values(), strict=True):
        assert torch.equal(a, b)
    options = TuneOptions(dtype="bf16", tolerance=1e-6)
    lab = gauntlet.Lab(task.build, task.evaluate, task.example_inputs, options)
    every = frozenset(c.label() for c in lab.found.instances)
    counts = gauntlet.fresh_passes(task, options, {"fp32": every, "low": frozenset(), "none": None}, draws=2)
    # keeping every candidate FP32 reproduces each draw's baseline; all-low moves cosine by more than 1e-6
    assert counts == {"fp32": 2, "low": 0, "none": None}
    with pytest.raises(RuntimeError, match="other candidates"):
        gauntlet.fresh_passes(task, options, {"x": frozenset({"no.such:linear#0"})}, draws=1)

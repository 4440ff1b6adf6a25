"""benchmarks/oracle.py, the best-known-plan reference: on a planted task its plan meets the target when
deployed, keeps exactly the planted pair FP32, and its FLOP share is at least mpt's."""
import importlib.util
import sys
from pathlib import Path

import tuner
from tuner.options.tune import TuneOptions
from tuner.search.session import tune
from tuner.testing import PlantedTask

ORACLE = Path(__file__).resolve().parents[2] / "benchmarks" / "oracle.py"


def _oracle_module():
    spec = importlib.util.spec_from_file_location("mpt_bench_oracle", ORACLE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_oracle_plan_meets_target_and_is_at_least_as_good_as_mpt():
    oracle = _oracle_module()
    task = PlantedTask(8, 2, samples=128)
    options = TuneOptions(dtype="bf16", tolerance=0.01)
    mpt = tune(task.build, task.evaluate, task.example_inputs, options)
    best = oracle.best_plan(task.build, task.evaluate, task.example_inputs, options)

    assert best.fp32 is not None and not best.all_low_passed
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

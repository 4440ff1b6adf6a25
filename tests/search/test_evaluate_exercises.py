"""An evaluate must measure what mpt tunes: one that never calls the model's forward (another method, a cached
traced graph), or whose metric does not move when the all-low output is far off, is refused (UserCodeError)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from tuner.core.errors import UserCodeError
from tuner.options.tune import TuneOptions
from tuner.search.results import TuneStatus
from tuner.search.session import tune

ASSET = Path(__file__).parents[1] / "assets" / "cancel_model.py"


@pytest.fixture
def cancel(monkeypatch):
    def load(how: str):
        monkeypatch.setenv("MPT_EVAL", how)
        spec = importlib.util.spec_from_file_location(f"mpt_cancel_{how}", ASSET)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)  # a fresh module: its trace cache starts empty
        return mod

    return load


def _tune(mod):
    return tune(mod.build_model, mod.evaluate, mod.example_inputs, TuneOptions(dtype="bf16", tolerance=0.01))


@pytest.mark.plan
def test_an_evaluate_through_forward_keeps_the_cancelling_linears_fp32(cancel):
    result = _tune(cancel("forward"))
    # all-bf16 fails (agreement 0.24 against 0.99, on any CPU): the plan needs FP32
    assert result.status is TuneStatus.MET and result.plan.fp32_instances


def test_an_evaluate_through_another_method_is_refused_at_the_baseline(cancel):
    mod = cancel("encode")
    with pytest.raises(UserCodeError, match=r"without calling the model \(the FP32 baseline\).*model.encode"):
        _tune(mod)


def test_a_cached_traced_graph_is_refused(cancel):
    mod = cancel("traced")
    with pytest.raises(UserCodeError, match=r"without calling the model.*torch.jit.trace"):
        _tune(mod)
    assert "trace" in mod._CACHE  # the first baseline traced (and so called) the model; the second did not


def test_a_metric_that_ignores_the_forward_it_runs_is_refused(cancel):
    mod = cancel("ignored")
    with pytest.raises(UserCodeError, match=r"output on the example inputs changes by 7\.\d+e-01.*did not change"):
        _tune(mod)


def test_a_call_through_a_deep_copy_counts(cancel):
    import copy

    mod = cancel("forward")

    def evaluate(model):
        with torch.no_grad():
            return mod._score(copy.deepcopy(model)(mod.X))

    result = tune(mod.build_model, evaluate, mod.example_inputs, TuneOptions(dtype="bf16", tolerance=0.01,
                                                                              max_evals=4))
    assert result.evals >= 3

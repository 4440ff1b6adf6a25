"""Every evaluation runs with torch's global state as the tune started: leaks are put back and reported once;
a model that is not FP32, or a tune started inside torch.autocast, is refused before the baseline."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from tuner.core.errors import ConfigError, UserCodeError
from tuner.core.torch_state import TorchState
from tuner.options.tune import TuneOptions
from tuner.search.session import tune

X = torch.linspace(-2, 2, 64 * 8).reshape(64, 8)


def build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


with torch.no_grad():
    REF = build()(X)


class Leaky:
    """An evaluate that records the state it starts in, then leaves torch's global settings changed."""

    def __init__(self) -> None:
        self.seen: list[TorchState] = []

    def __call__(self, model: nn.Module) -> float:
        self.seen.append(TorchState.capture())
        x = torch.zeros(64, 8) + X  # made in the default dtype: float64 if an earlier call's leak stayed
        with torch.no_grad():
            err = float((model(x) - REF).abs().max())
        torch.set_default_dtype(torch.float64)
        torch.set_grad_enabled(False)
        torch.autocast("cpu", dtype=torch.bfloat16).__enter__()  # entered, never exited
        torch.set_num_threads(max(1, torch.get_num_threads() - 1) if torch.get_num_threads() > 1 else 2)
        return 1.0 - err


@pytest.fixture
def clean_state():
    start = TorchState.capture()
    yield start
    start.restore()


def test_a_leaking_evaluate_runs_every_trial_in_the_start_state_and_is_warned_once(clean_state):
    evaluate = Leaky()
    result = tune(build, evaluate, (X,), TuneOptions(dtype="bf16", tolerance=0.05, max_evals=6))
    assert len(evaluate.seen) >= 2  # the baseline run and at least the all-low trial
    assert all(seen == clean_state for seen in evaluate.seen)
    assert TorchState.capture() == clean_state  # and the caller gets its own state back
    assert result.noise == 0.0 and all(t.error is None for t in result.trials)
    leaks = [w for w in result.warnings if "global state" in w]
    assert len(leaks) == 1, result.warnings
    for what in ("default dtype float32 -> float64", "grad mode on -> off", "torch.autocast(cpu) off -> on",
                 "threads"):
        assert what in leaks[0]


def test_a_clean_evaluate_gets_no_warning(clean_state):
    def evaluate(model: nn.Module) -> float:
        with torch.no_grad():
            return 1.0 - float((model(X) - REF).abs().max())

    result = tune(build, evaluate, (X,), TuneOptions(dtype="bf16", tolerance=0.05, max_evals=4))
    assert not any("global state" in w for w in result.warnings)


def test_a_bf16_model_is_refused_before_the_baseline(clean_state):
    calls = []

    def evaluate(model: nn.Module) -> float:
        calls.append(1)
        return 1.0

    with pytest.raises(UserCodeError, match=r"not in float32 \(\d+ in bfloat16, first: parameter 0.weight\)"):
        tune(lambda: build().to(torch.bfloat16), evaluate, (X,), TuneOptions(dtype="bf16"))
    assert calls == []


def test_a_tune_inside_torch_autocast_is_refused(clean_state):
    calls = []

    def evaluate(model: nn.Module) -> float:
        calls.append(1)
        return 1.0

    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(ConfigError, match=r"inside an active torch.autocast\(cpu\)"):
            tune(build, evaluate, (X,), TuneOptions(dtype="bf16"))
    assert calls == []


def test_global_module_hooks_an_evaluate_leaves_are_removed_and_those_build_registers_are_kept(clean_state):
    """An evaluate that registers a global forward hook per call (one that casts every module's output) runs
    with its own hook each time, mpt's own forwards with none: no internal error, and a warning says so. A hook
    build_model() registers is the model's and stays for every evaluation."""
    calls = []

    def evaluate(model: nn.Module) -> float:
        calls.append(len(torch.nn.modules.module._global_forward_hooks))
        torch.nn.modules.module.register_module_forward_hook(
            lambda m, i, o: o.to(torch.bfloat16).float() if isinstance(o, torch.Tensor) else None)
        with torch.no_grad():
            return float(torch.nn.functional.cosine_similarity(model(X).flatten(), REF.flatten(), dim=0))

    # tolerance 1e-9: the all-bf16 trial (cosine 2.5e-6 below the baseline's) fails by far on any CPU, so the
    # search goes on past it (at 1e-6 it failed by 1.4 tolerances, a float32 cosine's rounding from passing)
    result = tune(build, evaluate, (X,), TuneOptions(dtype="bf16", tolerance=1e-9, max_evals=5))
    assert result.evals >= 3 and calls == [0] * len(calls)  # every evaluate starts with no hook left over
    assert any("global forward hook(s) added" in w for w in result.warnings)
    assert TorchState.capture() == clean_state

    marks = []

    def build_hooked() -> nn.Module:
        torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: marks.append(1))
        return build()

    def count(model: nn.Module) -> float:
        before = len(marks)
        with torch.no_grad():
            model(X)
        return float(len(marks) > before)  # 1.0 only while the model's own hook runs

    handles = dict(torch.nn.modules.module._global_forward_hooks)
    try:
        kept = tune(build_hooked, count, (X,), TuneOptions(dtype="bf16", max_evals=3))
        assert kept.baseline == 1.0 and all(t.metric == 1.0 for t in kept.trials)
    finally:
        torch.nn.modules.module._global_forward_hooks.clear()
        torch.nn.modules.module._global_forward_hooks.update(handles)

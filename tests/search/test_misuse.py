"""An evaluate's mistakes that the FP32 baseline's run shows (issue 45): a clear error (exit 4: the user's code) or
a warning in the report, never a plan that claims what did not happen."""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tuner.core.errors import UserCodeError
from tuner.search.session import tune

_G = torch.Generator().manual_seed(3)
X = torch.randn(64, 8, generator=_G)
Y = (X @ torch.randn(8, 3, generator=_G)).argmax(1)


def build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 3))


def trainer(*, step: bool = True, train_mode: bool = True, around: Callable[[], Any] = contextlib.nullcontext,
            half: bool = False) -> Callable[[nn.Module], float]:
    def evaluate(model: nn.Module) -> float:
        if half:
            model.half()
        if train_mode:
            model.train()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            with around():
                loss = F.cross_entropy(model(X.to(next(model.parameters()).dtype)).float(), Y)
            opt.zero_grad()
            loss.backward()
            if step:
                opt.step()
        model.eval()
        with torch.no_grad(), around():
            return float((model(X.to(next(model.parameters()).dtype)).argmax(1) == Y).float().mean())
    return evaluate


def test_a_training_tune_whose_evaluate_never_steps_the_optimizer_is_refused():
    with pytest.raises(UserCodeError, match="changed no parameter .*optimizer.step"):
        tune(build, trainer(step=False), (X[:4],), for_training=True, tolerance=0.5)


def test_torch_autocast_inside_evaluate_is_refused():
    bf16 = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    with pytest.raises(UserCodeError, match=r"inside torch.autocast\('cpu'\)"):
        tune(build, trainer(around=bf16), (X[:4],), for_training=True, tolerance=0.5)


def test_an_evaluate_that_calls_model_half_is_refused():
    with pytest.raises(UserCodeError, match="converted the model to float16"):
        tune(build, trainer(half=True), (X[:4],), tolerance=0.5)


def test_a_training_evaluate_tuned_for_inference_asks_did_you_mean_for_training():
    result = tune(build, trainer(), (X[:4],), tolerance=0.5)
    assert any("did you mean --for-training?" in w for w in result.warnings)


def test_a_training_evaluate_that_forgets_model_train_is_warned():
    result = tune(build, trainer(train_mode=False), (X[:4],), for_training=True, tolerance=0.5)
    assert any("model.train()" in w for w in result.warnings)
    plain = tune(build, trainer(), (X[:4],), for_training=True, tolerance=0.5)
    assert not any("model.train()" in w or "--for-training" in w for w in plain.warnings)


def unseeded() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))  # other weights on every build


def test_a_training_evaluate_with_an_unseeded_build_asks_did_you_mean_for_training():
    """Without --for-training the trained model is built again as is, and an unseeded build gives other weights:
    the error says what the user most likely meant."""
    with pytest.raises(UserCodeError, match="gave other weights.*did you mean --for-training"):
        tune(unseeded, trainer(), (X[:4],), tolerance=0.5)


def test_model_half_is_named_even_when_the_evaluate_it_breaks_raises():
    def evaluate(model: nn.Module) -> float:
        model.half()
        return float(model(X).float().mean())  # float inputs to a half model: raises

    with pytest.raises(UserCodeError, match="converted the model to float16"):
        tune(unseeded, evaluate, (X[:4],), tolerance=0.5)

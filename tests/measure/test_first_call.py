"""tuner.measure.deployed.FirstCall: the deployed forward observed inside a block that runs it (a trial's
evaluate), seeing what `observe` sees of the same model, plan and inputs, and leaving nothing behind."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode

from tuner import OpInstance, Plan
from tuner.core.inputs import ModelInputs, same_inputs
from tuner.engine.attach import attach, detach
from tuner.measure.deployed import FirstCall, NotAsClaimed, observe, stored_as, verify

BF16, FP32 = torch.bfloat16, torch.float32


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x, scale=1.0):
        if scale == 0:
            raise RuntimeError("no")
        return self.b(torch.relu(self.a(x))) * scale + x @ self.a.weight


PLAN = Plan(fp32_instances=(OpInstance("", "matmul", 0),))  # the root's matmul FP32, the linears low
X = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))


def _watched(model: nn.Module, *calls: tuple) -> FirstCall:
    """Each of `calls` run through `model` with PLAN attached and the first one watched (on X)."""
    expected = ModelInputs.of((X,))
    attach(model, PLAN)
    watch = FirstCall(model, PLAN, lambda a, k: same_inputs(ModelInputs(tuple(a), dict(k)), expected))
    failed = False
    try:
        with torch.no_grad():
            for args in calls:
                try:
                    model(*args)
                except RuntimeError:
                    failed = True
    finally:
        watch.close()
        detach(model)
    assert not failed or watch.seen is None
    return watch


def test_the_first_call_on_the_inputs_is_seen_as_observe_sees_it():
    model = Net().eval()
    lowered = {"a.bias": BF16, "b.weight": BF16, "b.bias": BF16}
    with stored_as(model, lowered):
        expected = observe(model, PLAN, (X,))
        watch = _watched(model, (X,), (X * 2,))
    assert watch.seen is not None
    assert watch.seen.gemms == expected.gemms == {"a": {BF16}, "b": {BF16}, "": {FP32}}
    assert watch.seen.flops == expected.flops and watch.seen.uses == expected.uses
    assert not model._forward_pre_hooks and not model._forward_hooks  # its hooks are gone
    assert _get_current_dispatch_mode() is None


@pytest.mark.parametrize("first", [(X * 2,), (X, 0.0)], ids=["other inputs", "raised"])
def test_a_first_call_on_other_inputs_or_that_raises_is_not_seen(first):
    model = Net().eval()
    watch = _watched(model, first, (X,))  # only the first call is looked at
    assert watch.seen is None
    assert not model._forward_pre_hooks and not model._forward_hooks
    assert _get_current_dispatch_mode() is None


def test_verify_checks_a_forward_seen_already_without_running_one():
    model = Net().eval()
    watch = _watched(model, (X,))
    claimed = {"a": {BF16}, "b": {BF16}, "": {FP32}}
    calls = []
    model.register_forward_pre_hook(lambda *a: calls.append(1))
    verify(model, PLAN, (X,), {}, claimed, {}, seen=watch.seen)
    assert calls == []
    with pytest.raises(NotAsClaimed, match=r"\(root\): matmuls/convs ran in float32, the plan claims bfloat16"):
        verify(model, PLAN, (X,), {}, {**claimed, "": {BF16}}, {}, seen=watch.seen)


class Refines(nn.Module):
    """A forward that calls the model again on its own output (a refinement step)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(8, 8)
        self.head = nn.Linear(8, 8)

    def forward(self, x, again=True):
        y = self.a(x)
        if again:
            y = self(y, again=False)
        return self.head(y)


def test_a_forward_that_calls_the_model_again_is_watched_to_its_own_end():
    model = Refines().eval()
    expected = observe(model, Plan(), (X,))
    inputs = ModelInputs.of((X,))
    attach(model, Plan())
    watch = FirstCall(model, Plan(), lambda a, k: same_inputs(ModelInputs(tuple(a), dict(k)), inputs))
    try:
        with torch.no_grad():
            model(X)
    finally:
        watch.close()
        detach(model)
    assert watch.seen is not None and watch.seen.flops == expected.flops  # the inner call's matmuls counted too
    assert watch.seen.gemms == expected.gemms
    assert not model._forward_pre_hooks and not model._forward_hooks

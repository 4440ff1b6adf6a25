"""A whole training loop inside `tuner.autocast` trains as the same policy wrapping the forward alone does
(issue 41): no cast of a parameter outlives an optimizer step, and ops that update buffers in place
(BatchNorm's running statistics) update the model's own FP32 buffers whatever dtype they compute in."""
import contextlib
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import tuner
from tuner.policy.plan import OpInstance, Plan

STEPS = 6


def cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(32, 1, 8, 8, generator=g) * 3 + 1, torch.randint(0, 3, (32,), generator=g)


def train(model: nn.Module, around_loop: Callable[[], Any], around_forward: Callable[[], Any]) -> nn.Module:
    x, y = data()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with around_loop():
        for _ in range(STEPS):
            with around_forward():
                loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model


def policies() -> list[Any]:
    names = [n for n in tuner.preset_names() if n != "torch-cuda" or torch.cuda.is_available()]
    all_low = Plan(dtype="bf16", preset="torch-cpu")  # torch.autocast's own lists: runs torch.autocast itself
    one_fp32 = Plan(dtype="bf16", preset="hmp", fp32_instances=(OpInstance("4", "linear", 0),))
    return [*names, all_low, one_fp32]


def same(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


@pytest.mark.parametrize("policy", policies(), ids=lambda p: p if isinstance(p, str) else f"plan-{p.preset}")
def test_a_loop_inside_the_policy_trains_as_the_forward_alone_under_it(policy):
    whole = train(cnn(), lambda: tuner.autocast(policy), contextlib.nullcontext)
    forward = train(cnn(), contextlib.nullcontext, lambda: tuner.autocast(policy))
    assert all(t.dtype == torch.float32 for t in whole.state_dict().values() if t.is_floating_point())
    assert same(whole, forward)  # the first step's casts would have trained stale weights (0.14 vs 0.94)


def test_torch_lists_around_the_loop_train_bit_for_bit_as_torch_autocast_around_the_forward():
    whole = train(cnn(), lambda: tuner.autocast("torch-cpu"), contextlib.nullcontext)
    reference = train(cnn(), contextlib.nullcontext, lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    assert same(whole, reference)
    assert not same(whole, train(cnn(), contextlib.nullcontext, contextlib.nullcontext))  # it did lower something


@pytest.mark.parametrize("preset", ["hmp", "gaudi"])
def test_batch_norm_lowered_by_the_lists_updates_the_models_own_running_statistics(preset):
    assert "batch_norm" in tuner.load_preset(preset).lower  # the case: the default bf16 list lowers it
    lowered = train(cnn(), contextlib.nullcontext, lambda: tuner.autocast(preset))
    fp32 = train(cnn(), contextlib.nullcontext, contextlib.nullcontext)
    bn, ref = lowered[1], fp32[1]
    assert bn.running_var.dtype == torch.float32 and bn.num_batches_tracked.item() == STEPS
    assert not torch.equal(bn.running_var, torch.ones(4))  # copies took the update: it stayed at 1.0
    torch.testing.assert_close(bn.running_var, ref.running_var, rtol=0.05, atol=0.05)
    torch.testing.assert_close(bn.running_mean, ref.running_mean, rtol=0.05, atol=0.05)

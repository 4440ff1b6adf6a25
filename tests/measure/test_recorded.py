"""record_plan: one recorded forward gives a plan's shares, claims and idle overrides, and the report reuses
the tune's recording instead of running its own."""
from __future__ import annotations

import torch
from torch import nn

import tuner.report.checkpoint as checkpoint
from tuner.core.inputs import ModelInputs
from tuner.measure.recorded import record_plan
from tuner.policy.plan import OpInstance, Plan
from tuner.policy.presets import load_preset
from tuner.report.checkpoint import plan_pass
from tuner.search.candidates import find_candidates


class Chain(nn.Module):
    """A linear whose output feeds a passthrough op (mul) and a second linear."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(32, 32)
        self.b = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x) * 3.0)


def _chain() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Chain().eval(), torch.randn(8, 32)


def test_an_idle_override_is_found_and_dropping_it_changes_no_share_or_claim():
    model, x = _chain()
    a, mul = OpInstance("a", "linear", 0), OpInstance("", "mul", 0)
    found = find_candidates(model, ModelInputs.of((x,)), load_preset("torch-cpu"), torch.bfloat16, {})
    assert {a, mul} <= set(found.instances)  # both change the numbers in bf16: both are decided
    with_idle = record_plan(model, Plan(fp32_instances=(a, mul)), (x,))
    assert with_idle.idle == {mul}  # with `a` in FP32 the mul gets FP32 inputs: its override changes nothing
    without = record_plan(model, Plan(fp32_instances=(a,)), (x,))
    assert not without.idle
    assert (with_idle.shares, with_idle.claimed, with_idle.tolerated) == \
        (without.shares, without.claimed, without.tolerated)
    assert with_idle.claimed == {"a": {torch.float32}, "b": {torch.bfloat16}}
    assert not record_plan(model, Plan(fp32_instances=(mul,)), (x,)).idle  # alone, the mul's inputs are bf16


def test_plan_pass_reuses_a_recording_and_records_only_without_one(monkeypatch):
    model, x = _chain()
    plan = Plan(fp32_instances=(OpInstance("a", "linear", 0),))
    calls = []
    monkeypatch.setattr(checkpoint, "record_plan", lambda *a: calls.append(a) or record_plan(*a))
    fresh = plan_pass(model, plan, (x,))
    assert len(calls) == 1
    reused = plan_pass(model, plan, (x,), recorded=record_plan(model, plan, (x,)))
    assert len(calls) == 1 and reused == fresh

"""Candidates: the op instances a tune decides about, as one value, from a tiny real model."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from tuner.core.inputs import ModelInputs
from tuner.measure.shares import Shares
from tuner.policy.plan import OpInstance
from tuner.policy.presets import load_preset
from tuner.search.candidates import Candidates, find_candidates


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x).view(2, 8)  # view: neutral, never a candidate
        return self.b(torch.tanh(h) * 2.0)


def found_in_tiny() -> tuple[Candidates, nn.Module, ModelInputs]:
    torch.manual_seed(0)
    model = Tiny().eval()
    inputs = ModelInputs.of((torch.randn(2, 8),))
    return find_candidates(model, inputs, load_preset("torch-cpu"), torch.bfloat16, {}), model, inputs


def test_candidates_of_a_tiny_model():
    found, model, inputs = found_in_tiny()
    assert {c.label() for c in found.instances} >= {"a:linear#0", "b:linear#0"}
    assert not any(c.op == "view" for c in found.instances)
    assert found.inputs is inputs and len(found) == len(found.instances)
    assert torch.equal(found.ref_out, model(*inputs.args))  # the FP32 reference, not a side effect any more
    assert found.flops[OpInstance("a", "linear", 0)] == 2 * 2 * 8 * 8
    assert all(found.costs[c] >= found.flops[c] for c in found.instances)
    assert found.all_low.lower_flops == found.all_low.flops > 0  # every matmul runs low under the preset
    assert 0 < found.all_low_error < 0.1
    assert dict(found.fp32_modules) == {}


def test_units_group_candidates_by_calling_module_in_call_order():
    found, _, _ = found_in_tiny()
    units = found.units()
    assert sorted(i for u in units for i in u) == list(range(len(found)))
    modules = [found.instances[u[0]].module for u in units]
    assert modules == list(dict.fromkeys(c.module for c in found.instances))
    assert all(len({found.instances[i].module for i in u}) == 1 for u in units)


def test_shares_without_moves_the_fp32_set_out_of_the_lower_share():
    found, _, _ = found_in_tiny()
    a = OpInstance("a", "linear", 0)
    shares = found.shares_without(frozenset({a}))
    assert shares.lower_flops == found.all_low.lower_flops - found.flops[a]
    assert shares.lower_calls == found.all_low.lower_calls - 1
    assert found.by_label(("b:linear#0", "a:linear#0")) == (a, OpInstance("b", "linear", 0))
    assert found.pick(frozenset({0})) == frozenset({found.instances[0]})


def test_a_candidate_without_a_cost_is_refused():
    a = OpInstance("a", "linear", 0)
    with pytest.raises(ValueError, match="cost"):
        Candidates((a,), {}, {a: 1}, Shares(), None, {}, ModelInputs.of(()))


class RootMatmul(nn.Module):
    """A matmul in the model's own forward, next to the call that makes the root an FP32 island."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.w = nn.Parameter(torch.randn(8, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        return torch.matmul(h, self.w) + torch.tensordot(h, self.w, dims=1)


def test_the_own_candidates_of_an_fp32_island_are_kept_calls_not_choices():
    torch.manual_seed(0)
    model = RootMatmul().eval()
    inputs = ModelInputs.of((torch.randn(2, 8),))
    policy = load_preset("torch-cpu")
    free = find_candidates(model, inputs, policy, torch.bfloat16, {})
    assert {c.label() for c in free.instances} >= {"a:linear#0", "(root):matmul#0", "(root):tensordot#0"}
    tensordot = OpInstance("", "tensordot", 0)
    found = find_candidates(model, inputs, policy, torch.bfloat16, {}, (tensordot,))
    assert [c.label() for c in found.instances] == ["a:linear#0"]
    assert found.fp32_calls == (OpInstance("", "matmul", 0), tensordot)
    a = OpInstance("a", "linear", 0)
    assert found.all_low.lower_flops == found.flops[a] < found.all_low.flops  # the root's matmuls count FP32

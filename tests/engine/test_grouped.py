"""Grouped GEMMs (an MoE layer's experts, `torch._grouped_mm`) lowered by mpt where torch.autocast does not (issue 44).

A transformers-free experts module that calls `torch._grouped_mm` on its 3-d parameters as transformers 5's default
experts implementation does: the recorded forward (claims, shares, candidates), the deployed one (`tuner.load`'s
native path) and mpt's engine agree on what runs low, and where a plan keeps the experts FP32 they run FP32.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tuner
from tuner.core.inputs import ModelInputs
from tuner.engine.attach import attach, detach
from tuner.engine.grouped import may_group
from tuner.measure.deployed import observe
from tuner.measure.recorded import record_plan
from tuner.policy.plan import OpInstance, Plan
from tuner.search.candidates import find_candidates

if not hasattr(torch, "_grouped_mm"):
    pytest.skip("this torch has no torch._grouped_mm", allow_module_level=True)

EXPERTS, DIM, HIDDEN = 4, 8, 16


class Experts(nn.Module):
    """Each token through two of four experts, their weights stacked in 3-d parameters (transformers' layout)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.randn(EXPERTS, 2 * HIDDEN, DIM) * 0.3)
        self.down_proj = nn.Parameter(torch.randn(EXPERTS, DIM, HIDDEN) * 0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = torch.arange(2 * x.shape[0], device=x.device) % EXPERTS
        order = torch.argsort(ids, stable=True)
        tokens = x[order // 2]
        offs = torch.cumsum(torch.bincount(ids, minlength=EXPERTS), 0).to(torch.int32)
        h = torch._grouped_mm(tokens, self.gate_up_proj.transpose(-2, -1), offs=offs)
        gate, up = h.chunk(2, dim=-1)
        out = torch._grouped_mm(F.silu(gate) * up, self.down_proj.transpose(-2, -1), offs=offs)
        back = torch.empty_like(out)
        back[order] = out
        return back.view(x.shape[0], 2, DIM).sum(1)


class Moe(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(DIM, DIM)
        self.experts = Experts()
        self.head = nn.Linear(DIM, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.experts(self.inp(x)))


def _model() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Moe().eval(), torch.randn(6, DIM)


def _grouped_dtypes(model: nn.Module, plan: Plan, x: torch.Tensor) -> set[torch.dtype]:
    """The dtypes the deployed forward's `_grouped_mm` calls computed in (their outputs')."""
    found: set[torch.dtype] = set()
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket.__name__ == "_grouped_mm":
                found.add(out.dtype)
            return out

    attach(model, plan)
    try:
        with torch.no_grad(), Seen():
            model(x)
    finally:
        detach(model)
    return found


def test_only_modules_owning_stacked_matrices_may_group():
    model, _ = _model()
    assert [p for p, m in model.named_modules() if may_group(m)] == ["experts"]
    assert not any(may_group(m) for m in (nn.Conv1d(2, 3, 3), nn.Conv2d(2, 3, 3), nn.Bilinear(2, 2, 3)))
    embedded = nn.Module()
    embedded.pos = nn.Parameter(torch.zeros(1, 16, DIM))  # a learned position embedding: no stack of matrices
    assert not may_group(embedded)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_attached_plan_runs_the_experts_low_and_claims_what_runs(dtype):
    model, x = _model()
    plan = Plan(dtype="bf16" if dtype is torch.bfloat16 else "fp16")
    assert _grouped_dtypes(model, plan, x) == {dtype}  # torch.autocast alone leaves them FP32
    recorded = record_plan(model, plan, (x,))
    assert recorded.claimed["experts"] == {dtype}
    seen = observe(model, plan, (x,))
    assert seen.gemms["experts"] == {dtype}
    assert recorded.shares.lower_flops == recorded.shares.flops > 0
    assert seen.flop_share == 1.0
    assert set(seen.lowered) >= {"experts.gate_up_proj", "experts.down_proj"}  # the checkpoint stores them low
    with torch.no_grad():
        attach(model, plan, engine="python")
        by_engine = model(x)
        attach(model, plan)
        native = model(x)
        detach(model)
    assert torch.equal(by_engine, native)  # mpt's engine and torch.autocast's path: the same bits
    assert "forward" not in model.experts.__dict__  # detached: its own forward again


def test_experts_kept_fp32_run_fp32_and_the_shares_agree():
    model, x = _model()
    plan = Plan(fp32_instances=(OpInstance("experts", "_grouped_mm", 0), OpInstance("experts", "_grouped_mm", 1)))
    assert _grouped_dtypes(model, plan, x) == {torch.float32}
    recorded = record_plan(model, plan, (x,))
    seen = observe(model, plan, (x,))
    assert recorded.claimed["experts"] == seen.gemms["experts"] == {torch.float32}
    assert 0 < seen.flop_share == recorded.shares.lower_flops / recorded.shares.flops < 1
    assert "experts.gate_up_proj" not in seen.lowered


def test_grouped_gemms_are_candidates_and_the_attached_model_pickles():
    model, x = _model()
    found = find_candidates(model, ModelInputs.of((x,)), Plan().policy(), torch.bfloat16, {})
    grouped = [c for c in found.instances if c.op == "_grouped_mm"]
    assert [(c.module, c.index) for c in grouped] == [("experts", 0), ("experts", 1)]
    assert all(found.flops[c] > 0 for c in grouped)
    tuner.attach(model, Plan())
    copied = copy.deepcopy(model)  # the experts' wrapped forward is not what a copy carries
    assert "forward" not in copied.experts.__dict__ or tuner.attached(copied) is not None
    with torch.no_grad():
        assert torch.equal(copied(x), model(x))


def test_an_attached_moe_compiles_to_what_it_runs_eagerly():
    """torch.compile traced the experts' forward without the casts (a dtype error at the grouped GEMM): the experts
    module runs eagerly in the compiled model, in the plan's dtype."""
    model, x = _model()
    tuner.attach(model, Plan())
    with torch.no_grad():
        eager = model(x)
        compiled = torch.compile(model, backend="eager")(x)
    assert torch.equal(compiled, eager)

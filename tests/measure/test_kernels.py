"""Issue 40: an op whose kernel computes in another dtype than it was cast to (torch's CPU attention fallback widens
bf16 q/k/v to FP32 for grouped-query heads and for transposed q/k/v) is counted, claimed and shown as what it ran,
and the claims check compares the report's share with the one counted per ATen call."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import tuner
from tuner import Plan
from tuner.measure.deployed import GEMMS, NotAsClaimed, verify
from tuner.measure.flops import aten_flops
from tuner.measure.inspection import inspect_model
from tuner.report.checkpoint import plan_pass, verify_plan_pass

BF16, FP32 = torch.bfloat16, torch.float32


class GroupedQuery(nn.Module):
    """Four query heads, one key/value head broadcast over them (multi-query attention, as Falcon's default)."""

    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.heads = heads
        self.q, self.kv, self.o = nn.Linear(d, d), nn.Linear(d, 2 * d // heads), nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q = self.q(x).view(b, t, self.heads, d // self.heads).transpose(1, 2)
        k, v = self.kv(x).view(b, t, 1, 2 * d // self.heads).transpose(1, 2).chunk(2, -1)
        return self.o(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d))


class TransposedAttention(nn.Module):
    """A UNet-style self-attention over pixels: q/k/v are [batch, 1, pixels, channels] views of [batch, channels,
    pixels] (their last dimension not contiguous)."""

    def __init__(self, c: int = 16) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.qkv, self.o = nn.Conv2d(c, 3 * c, 1), nn.Conv2d(c, c, 1)

    def forward(self, x):
        b, c, h, w = x.shape
        q, k, v = (t.transpose(1, 2).unsqueeze(1) for t in self.qkv(x).flatten(2).chunk(3, 1))
        return self.o(F.scaled_dot_product_attention(q, k, v).squeeze(1).transpose(1, 2).reshape(b, c, h, w))


CASES = {"grouped-query": (GroupedQuery, (2, 8, 32), "key/value heads expanded"),
         "transposed q/k/v": (TransposedAttention, (2, 16, 4, 4), "contiguous")}


def aten_share(model: nn.Module, x: torch.Tensor) -> float:
    """The share of matmul/conv FLOPs the model runs in bf16, counted per ATen call by its output's dtype
    (benchmarks/aten_share.py's count)."""
    flops = {BF16: 0, FP32: 0}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if name in GEMMS:
                first = next(t for t in tree_leaves(out) if isinstance(t, torch.Tensor))
                flops[first.dtype] += aten_flops(name, args, kwargs or {}, out)
            return out

    with torch.no_grad(), Count():
        model(x)
    return flops[BF16] / (flops[BF16] + flops[FP32])


@pytest.mark.parametrize("case", CASES)
def test_the_report_counts_attention_as_its_kernel_ran(case):
    """The plan's shares and claims (the report's) take the attention fallback's FP32 matmuls as FP32: its share
    is the loaded plan's share counted per ATen call, below 100%, and the deployed check passes."""
    make, shape, _ = CASES[case]
    model, x = make().eval(), torch.randn(*shape)
    planned = plan_pass(model, Plan(), (x,))
    counted = aten_share(tuner.load(make().eval(), Plan()), x)
    assert 0 < counted < 1
    assert planned.shares.flop_share == pytest.approx(counted, abs=1e-12)
    assert planned.claimed[""] == {FP32}  # the root's attention: its matmuls ran in FP32
    verify_plan_pass(model, Plan(), (x,), planned)


def test_the_claims_check_compares_the_reported_share_with_the_aten_count():
    """A report share that is not what the deployed forward ran low is an internal error, even where every
    module's dtypes match (the root's FP32 ops make FP32 matmuls there look tolerated)."""
    model, x = GroupedQuery().eval(), torch.randn(2, 8, 32)
    planned = plan_pass(model, Plan(), (x,))
    with pytest.raises(NotAsClaimed, match="counted per ATen call"):
        verify(model, Plan(), (x,), planned.lowered, planned.claimed, planned.tolerated, share=1.0)


@pytest.mark.parametrize("case", CASES)
def test_inspect_shows_what_the_kernel_ran_and_the_cheap_change(case):
    """`mpt inspect`'s record of the attention says fp32 and names the change that lets it run in bf16, found by
    trying it; the summary's FLOP share counts it FP32."""
    make, shape, change = CASES[case]
    model, x = make().eval(), torch.randn(*shape)
    result = inspect_model(model, (x,), "torch-cpu", "bf16")
    (attn,) = [r for r in result.records if r.op == "scaled_dot_product_attention"]
    assert attn.dtype == "fp32" and attn.output_dtype == "bf16"
    assert "kernel computed its matmuls in fp32" in attn.kernel_note and change in attn.kernel_note
    assert result.summary.lower_flop_share == pytest.approx(aten_share(tuner.load(make().eval(), Plan()), x))
    assert all(not r.kernel_note for r in result.records if r is not attn)

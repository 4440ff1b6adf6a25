"""FLOP counts: the recorded (Python-level) count of a forward is the ATen-level count of what runs (issue 34)."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from tuner.engine.attach import attach, detach
from tuner.measure.deployed import GEMMS
from tuner.measure.flops import aten_flops, op_flops
from tuner.measure.recorded import record_plan
from tuner.policy.plan import Plan


class Spectral(nn.Module):
    """An FNO-style layer: a complex einsum (never lowered) next to a linear (lowered)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 8, 4, dtype=torch.complex64))
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: batch, 8 channels, 8 points
        xf = torch.fft.rfft(x, dim=-1)[..., :4]
        y = torch.einsum("bim,iom->bom", xf, self.weight)
        return self.lin(torch.fft.irfft(y, n=8, dim=-1).transpose(1, 2))


def _aten_count(model: nn.Module, x: torch.Tensor) -> dict[bool, int]:
    """FLOPs of the ATen matmul/conv calls of one forward, by whether they computed in bf16/fp16."""
    found = {True: 0, False: 0}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if name in GEMMS:
                found[out.dtype in (torch.bfloat16, torch.float16)] += aten_flops(name, args, kwargs or {}, out)
            return out

    with torch.no_grad(), Count():
        model(x)
    return found


def test_einsum_flops_sum_over_the_contracted_index():
    a, w = torch.randn(2, 8, 4, dtype=torch.complex64), torch.randn(8, 8, 4, dtype=torch.complex64)
    out = torch.einsum("bim,iom->bom", a, w)
    assert op_flops("einsum", ("bim,iom->bom", a, w), {}, out) == 2 * 2 * 8 * 8 * 4  # not 2 per output element
    x, y = torch.randn(2, 3, 5, 6), torch.randn(6, 7)
    assert op_flops("einsum", ("...ij,jk->...ik", x, y), {}, x @ y) == 2 * 2 * 3 * 5 * 6 * 7
    assert op_flops("einsum", ("bij,bjk->bik", [torch.randn(2, 3, 4), torch.randn(2, 4, 5)]), {},
                    torch.randn(2, 3, 5)) == 2 * 2 * 3 * 4 * 5


def test_the_recorded_share_of_a_spectral_layer_is_the_aten_share():
    torch.manual_seed(0)
    model, x = Spectral().eval(), torch.randn(2, 8, 8)
    recorded = record_plan(model, Plan(), (x,)).shares
    with torch.autocast("cpu", torch.bfloat16):
        aten = _aten_count(model, x)
    assert recorded.flops == aten[True] + aten[False]
    assert recorded.lower_flops == aten[True]


def test_conv_and_transposed_conv_count_alike_at_both_levels():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ConvTranspose2d(6, 4, 2, stride=2),
                          nn.ConvTranspose2d(4, 2, 3, stride=1, padding=1, groups=2)).eval()
    x = torch.randn(2, 3, 8, 8)
    recorded = record_plan(model, Plan(), (x,)).shares
    aten = _aten_count(model, x)
    assert recorded.flops == aten[True] + aten[False] > 0


def _deployed_count(model: nn.Module, plan: Plan, x: torch.Tensor) -> dict[bool, int]:
    """`_aten_count` of the model with `plan` attached as `tuner.load` attaches it (the deployed forward)."""
    attach(model, plan)
    try:
        return _aten_count(model, x)
    finally:
        detach(model)


class Calls(nn.Module):
    """Matmul-like ops that ATen runs as other calls (mm, dot, _trilinear, conv_tbc), on weights of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Parameter(torch.randn(6, 5)), nn.Parameter(torch.randn(5, 9))
        self.c, self.v = nn.Parameter(torch.randn(9, 4)), nn.Parameter(torch.randn(4))
        self.bil = nn.Bilinear(6, 6, 3)
        self.tbc = nn.Parameter(torch.randn(3, 6, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: 4 x 6
        y = torch.tensordot(x, self.a, dims=1).sum() + torch.inner(x, self.a.T).sum()
        y = y + torch.linalg.multi_dot([x, self.a, self.b, self.c]).sum() + torch.linalg.matmul(x, self.a).sum()
        y = y + torch.linalg.multi_dot([x[0], self.a, self.b, self.c, self.v]) + torch.chain_matmul(x, self.a).sum()
        y = y + torch.tensordot(x[:, :2], self.c, dims=0).sum() + self.bil(x, x).sum()
        return y + torch.conv_tbc(x[:, None, :].repeat(1, 2, 1), self.tbc, self.v, 1).sum()


def test_bilinear_conv_tbc_and_chains_count_every_multiply_add():
    x1, x2, w = torch.randn(4, 6), torch.randn(4, 5), torch.randn(3, 6, 5)
    assert op_flops("bilinear", (x1, x2, w), {}, torch.nn.functional.bilinear(x1, x2, w)) == 2 * 4 * 3 * 6 * 5
    x, k = torch.randn(7, 2, 6), torch.randn(3, 6, 4)
    assert op_flops("conv_tbc", (x, k, torch.zeros(4), 1), {}, torch.conv_tbc(x, k, torch.zeros(4), 1)) == \
        2 * (7 * 2 * 4) * 3 * 6  # padding 1: 7 output steps
    a, b, c = torch.randn(10, 100), torch.randn(100, 5), torch.randn(5, 50)  # (ab)c: 5000 + 2500 multiply-adds
    assert op_flops("linalg_multi_dot", ([a, b, c],), {}, a @ b @ c) == 2 * (10 * 100 * 5 + 10 * 5 * 50)


@pytest.mark.filterwarnings("ignore:torch.chain_matmul is deprecated")
def test_composite_matmuls_count_at_the_python_level_what_aten_runs():
    """tensordot, inner, linalg.matmul, multi_dot and chain_matmul run as ATen mm/dot calls: the recorded count
    had 0 FLOPs for them. bilinear (ATen `_trilinear`) and conv_tbc were counted with the wrong weight
    dimensions, and as no ATen matmul at all. Whatever the plan, both levels now count the same FLOPs."""
    torch.manual_seed(0)
    model, x = Calls().eval(), torch.randn(4, 6)
    for plan in (Plan(), Plan(dtype="fp16")):
        recorded = record_plan(model, plan, (x,)).shares
        aten = _deployed_count(model, plan, x)
        assert recorded.flops == aten[True] + aten[False] > 0
        assert recorded.lower_flops == aten[True] > 0


class Cells(nn.Module):
    """The three recurrent cells, each stepped twice: ATen runs each step as two `linear` calls."""

    def __init__(self) -> None:
        super().__init__()
        self.gru, self.lstm = nn.GRUCell(6, 8), nn.LSTMCell(6, 8, bias=False)
        self.tanh, self.relu = nn.RNNCell(6, 8), nn.RNNCell(6, 8, nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: 4 x 6
        h = torch.zeros(4, 8)
        hc = (h, h)
        for _ in range(2):
            h = self.gru(x, h) + self.tanh(x, h) + self.relu(x, h)
            hc = self.lstm(x, hc)
        return h + hc[0]


def test_recurrent_cells_count_their_gate_matmuls_in_the_dtype_they_run():
    """nn.GRUCell/LSTMCell/RNNCell computed their gate matmuls in bf16 under torch.autocast, counted nowhere
    and claimed as passthrough FP32 (issue 34: NotAsClaimed). Both levels now count and claim the same."""
    torch.manual_seed(0)
    model, x = Cells().eval(), torch.randn(4, 6)
    per_step = 2 * 4 * (3 + 4 + 1 + 1) * 8 * (6 + 8)
    assert op_flops("gru_cell", (x, torch.zeros(4, 8), model.gru.weight_ih, model.gru.weight_hh), {}, None) == \
        2 * 4 * 3 * 8 * (6 + 8)
    for dtype in ("bf16", "fp16"):
        plan = Plan(dtype=dtype)
        record = record_plan(model, plan, (x,))
        aten = _deployed_count(model, plan, x)
        assert record.shares.flops == aten[True] + aten[False] == 2 * per_step
        assert record.shares.lower_flops == aten[True] == 2 * per_step
        assert all(record.claimed[p] == {plan.torch_dtype} for p in ("gru", "lstm", "tanh", "relu"))


def test_a_linear_on_a_nested_tensor_counts_each_sequence_at_its_own_length():
    """Issue 40: the linears of an nn.TransformerEncoder that nested its padded input reach ATen as `linear` on a
    NestedTensor; each sequence's tokens count, the dropped padding does not (it was 0: the share's bf16 went
    uncounted)."""
    nested = torch.nested.nested_tensor([torch.randn(3, 16), torch.randn(5, 16)])
    weight = torch.randn(8, 16)
    out = torch.nn.functional.linear(nested, weight)
    assert aten_flops("linear", (nested, weight), {}, out) == 2 * (3 + 5) * 8 * 16


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="this torch has no torch._grouped_mm")
def test_a_grouped_gemm_counts_each_groups_matmul_at_both_levels():
    """Issue 44: torch._grouped_mm (transformers 5's MoE experts) counted 0 FLOPs at either level, so a report
    claimed 100% low with the experts, most of the FLOPs, in FP32. Each form counts its groups' multiply-adds."""
    offs = torch.tensor([4, 4, 8, 12], dtype=torch.int32)  # an empty group included
    cases = [(torch.randn(12, 8), torch.randn(4, 8, 4), offs, 2 * 12 * 8 * 4),  # tokens x one matrix per expert
             (torch.randn(4, 3, 8), torch.randn(4, 8, 4), None, 2 * 4 * 3 * 8 * 4),  # batched
             (torch.randn(12, 4).T, torch.randn(12, 8), offs, 2 * 4 * 12 * 8)]  # the weight gradient: k split
    seen: list[int] = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            if func.overloadpacket.__name__ in GEMMS:
                seen.append(aten_flops(func.overloadpacket.__name__, args, kwargs or {}, result))
            return result

    for a, b, groups, expected in cases:
        kwargs = {"offs": groups} if groups is not None else {}
        out = torch._grouped_mm(a, b, **kwargs)
        assert op_flops("_grouped_mm", (a, b), kwargs, out) == expected
        seen.clear()
        with Count():
            torch._grouped_mm(a, b, **kwargs)
        assert seen == [expected]

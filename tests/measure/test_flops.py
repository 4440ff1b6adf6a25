"""FLOP counts: the recorded (Python-level) count of a forward is the ATen-level count of what runs (issue 34)."""
from __future__ import annotations

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

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

"""RoPE at long positions in bf16 without an autocast guard: the angles `positions @ inv_freq` (positions to
4096) computed by a matmul in bf16 are off by up to 16 radians, so the rotary embedding is noise. HF guards this
matmul with autocast disabled; here it is a candidate like any other. The angle matmul stays FP32; the
projections run in bf16. Metric: mean cosine to FP32 over the sequence.
"""
import torch
from _hazard_common import init, metric, randn
from torch import nn

TUNE = {"dtype": "bf16", "tolerance": 1e-3}
SPLIT = "heldout"


class Rotary(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 32, 2).float() / 32)))
        self.q = nn.Linear(32, 32)
        self.k = nn.Linear(32, 32)
        self.out = nn.Linear(64, 16)

    def rotate(self, x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        cos, sin = angles.cos(), angles.sin()
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        angles = torch.matmul(positions[:, None], self.inv_freq[None, :])  # no autocast guard: the hazard
        q, k = self.rotate(self.q(x), angles), self.rotate(self.k(x), angles)
        return self.out(torch.cat([q, k], dim=-1).float())


def build_model() -> nn.Module:
    return init(Rotary(), seed=91)


_X = randn(64, 32, seed=92)
_POS = torch.linspace(3000, 4096, 64)
evaluate = metric(build_model, (_X, _POS), "cosine")


def example_inputs():
    return (_X, _POS)

"""A hand-written RMSNorm without upcast in fp16: `x.pow(2).mean()` of hidden states of ~400 overflows
(400^2 > 65504) when `proj` (the producer) runs in fp16, so rsqrt gives 0 and the block's output collapses.
Keeping `proj` FP32 makes the norm compute in FP32. Metric: mean cosine to FP32.
"""
import torch
from _hazard_common import init, metric, randn
from torch import nn

TUNE = {"dtype": "fp16", "tolerance": 1e-3}
SPLIT = "heldout"


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)  # no .float(): the hazard


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(16, 48)
        self.proj = nn.Linear(48, 48)
        self.norm = RMSNorm(48)
        self.ff = nn.Linear(48, 48)
        self.head = nn.Linear(48, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.proj(torch.relu(self.embed(x))))
        return self.head(torch.relu(self.ff(h)))


def build_model() -> nn.Module:
    model = init(Net(), seed=61)
    with torch.no_grad():
        model.proj.weight.mul_(1500)
    return model


_X = randn(64, 16, seed=62)
evaluate = metric(build_model, (_X,), "cosine")


def example_inputs():
    return (_X[:8],)

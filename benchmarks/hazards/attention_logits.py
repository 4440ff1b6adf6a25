"""Attention logits past 65504 in fp16: unscaled q.k^T of large queries and keys (~300 each over 32 dims)
overflows in the scores matmul (softmax is FP32 in torch's lists, but its input is already inf). The
scores matmul stays FP32; the projections and the value matmul run in fp16. Metric: top-1 agreement of a
per-token classifier with FP32 over 8 sequences of 16 tokens (discrete).
"""
import torch
from _hazard_common import init, metric, randn
from torch import nn

TUNE = {"dtype": "fp16", "tolerance": 0.02, "absolute": True}
SPLIT = "design"


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(32, 32)
        self.k = nn.Linear(32, 32)
        self.v = nn.Linear(32, 32)
        self.o = nn.Linear(32, 32)
        self.cls = nn.Linear(32, 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(self.q(x), self.k(x).transpose(-1, -2)) * 1e-5
        h = torch.matmul(torch.softmax(scores, dim=-1), self.v(x))
        return self.cls(torch.relu(self.o(h)) + x)


def build_model() -> nn.Module:
    model = init(Attention(), seed=51)
    with torch.no_grad():
        model.q.weight.mul_(300)
        model.k.weight.mul_(300)
    return model


_X = randn(8, 16, 32, seed=52)
evaluate = metric(build_model, (_X,), "agreement")


def example_inputs():
    return (_X[:2],)

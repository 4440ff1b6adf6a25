"""Spread fp16 overflow: a 12-layer residual MLP where three layers spread through the depth (3, 7, 10)
scale up past 65504 and a fixed FP32 factor brings each back, so each of those must stay FP32 on its own;
no two are neighbours. 12 units: the best known plan is the best of the heuristics. Metric: mean cosine.
"""
import torch
from _hazard_common import init, metric, randn
from torch import nn

TUNE = {"dtype": "fp16", "tolerance": 1e-3}
SPLIT = "design"
BIG = (3, 7, 10)


class Spread(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(32, 32) for _ in range(12))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for n, layer in enumerate(self.layers):
            y = layer(x)
            x = x + torch.tanh(y * 1e-5 if n in BIG else y)
        return x


def build_model() -> nn.Module:
    model = init(Spread(), seed=71)
    with torch.no_grad():
        for n in BIG:
            model.layers[n].weight.mul_(2e5)
    return model


_X = randn(64, 32, seed=72)
evaluate = metric(build_model, (_X,), "cosine")


def example_inputs():
    return (_X[:8],)

"""Spread bf16 precision loss: a 12-layer residual MLP where three layers spread through the depth (2, 6, 9)
carry a large offset (bias 256) that the next op subtracts again, so bf16's rounding at 256 (step 2) wipes their
signal; the other nine are harmless. 12 units: the best known plan is the best of the heuristics. Metric: mean
cosine to FP32.
"""
import torch
from _hazard_common import init, metric, randn
from torch import nn

TUNE = {"dtype": "bf16", "tolerance": 1e-3}
SPLIT = "heldout"
OFFSET = (2, 6, 9)


class Spread(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(32, 32) for _ in range(12))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for n, layer in enumerate(self.layers):
            y = layer(x)
            x = x + torch.tanh(y - 256.0 if n in OFFSET else y)
        return x


def build_model() -> nn.Module:
    model = init(Spread(), seed=121)
    with torch.no_grad():
        for n in OFFSET:
            model.layers[n].bias.fill_(256.0)
    return model


_X = randn(64, 32, seed=122)
evaluate = metric(build_model, (_X,), "cosine")


def example_inputs():
    return (_X[:8],)

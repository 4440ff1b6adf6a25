"""A big-K regression head in bf16: one output summed over K=4096 features whose terms (~1 each) cancel to a
result ~100x smaller than their spread, so bf16's rounding of the head's inputs and weights moves the
prediction by much more than its own size. The head stays FP32; the feature layers run in bf16. Metric:
mean absolute error relative to FP32's mean |prediction| (lower is better, 0 = FP32).
"""
import torch
from torch import nn

from _shared import init, metric, randn

TUNE = {"dtype": "bf16", "tolerance": 0.02, "absolute": True, "lower_is_better": True}
SPLIT = "heldout"


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f1 = nn.Linear(16, 64)
        self.f2 = nn.Linear(64, 4096)
        self.head = nn.Linear(4096, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.f2(torch.relu(self.f1(x)))))


def build_model() -> nn.Module:
    model = init(Regressor(), seed=111)
    with torch.no_grad():
        model.head.weight.mul_(64.0)  # terms of ~1 that cancel: the sum is small against each
        model.head.bias.fill_(0.0)
    return model


_X = randn(128, 16, seed=112)
evaluate = metric(build_model, (_X,), "rel-mae")


def example_inputs():
    return (_X[:16],)

"""A big-K regression head in bf16: one output summed over K=4096 binary features that come in identical pairs
weighted +c and -c(1+d) (d ~ 1%), so the prediction is what is left after the pairs cancel; bf16's rounding of
the head's weights (~0.1% each) moves it by ~15%. The features are exact in bf16 (0 or 1, the pairs flip
together), so only the head must stay FP32. Metric: mean absolute error relative to FP32's mean |prediction|
(lower is better, 0 = FP32).
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
        return self.head((self.f2(torch.relu(self.f1(x))) > 0).float())


def build_model() -> nn.Module:
    model = init(Regressor(), seed=111)
    with torch.no_grad():
        model.f2.weight[1::2] = model.f2.weight[0::2]  # features in identical pairs
        d = 0.01 * torch.randn(2048, generator=torch.Generator().manual_seed(113))
        model.head.weight[0, 0::2] = 4.0
        model.head.weight[0, 1::2] = -4.0 * (1 + d)
    return model


_X = randn(128, 16, seed=112)
evaluate = metric(build_model, (_X,), "rel-mae")


def example_inputs():
    return (_X[:16],)

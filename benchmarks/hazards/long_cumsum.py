"""Long cumsum in bf16: sliding-window sums taken as differences of a running sum over 2048 steps (a common
trick) when the cumsum runs in bf16 (it runs in its input's dtype: the projection's, bf16): the running sum
reaches ~2048, where bf16's step is 16, so a window's sum of ~16 is lost in the difference. The cumsum (no
FLOPs) or its producer stays FP32; the encoder, the projection and the head can run in bf16. Metric: mean
absolute error relative to FP32's mean |output| (lower is better).
"""
import torch
from _hazard_common import init, metric, randn
from torch import nn

TUNE = {"dtype": "bf16", "tolerance": 0.01, "absolute": True, "lower_is_better": True}
SPLIT = "design"


class Scan(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(8, 16)
        self.step = nn.Linear(16, 4)
        self.head = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        steps = self.step(torch.tanh(self.enc(x))) + 1.0
        state = torch.cumsum(steps, dim=1)
        return self.head(((state[:, 16:] - state[:, :-16]) / 16).float())


def build_model() -> nn.Module:
    return init(Scan(), seed=101)


_X = randn(4, 2048, 8, seed=102)
evaluate = metric(build_model, (_X,), "rel-mae")


def example_inputs():
    return (_X[:1],)

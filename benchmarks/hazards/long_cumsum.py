"""Long cumsum in bf16: a running sum over 2048 steps of a projection's output (~1 per step) accumulates in
bf16 when the projection runs in bf16 (cumsum runs in its input's dtype), so late positions are off by tens.
The projection (or the cumsum) stays FP32; the encoder and the head run in bf16. Metric: mean cosine.
"""
import torch
from torch import nn

from _shared import init, metric, randn

TUNE = {"dtype": "bf16", "tolerance": 1e-3}
SPLIT = "design"


class Scan(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(8, 16)
        self.step = nn.Linear(16, 4)
        self.head = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        steps = self.step(torch.tanh(self.enc(x))) + 1.0
        state = torch.cumsum(steps, dim=1) / x.shape[1]
        return self.head(state.float())


def build_model() -> nn.Module:
    return init(Scan(), seed=101)


_X = randn(4, 2048, 8, seed=102)
evaluate = metric(build_model, (_X,), "cosine")


def example_inputs():
    return (_X[:1],)

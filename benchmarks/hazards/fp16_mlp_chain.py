"""fp16 overflow chain in an MLP: `up` outputs ~1e5 (past fp16's 65504) and feeds `down` directly.

Keeping `up` FP32 is not enough: `down` casts up's FP32 output to fp16 itself and overflows. Both must stay
FP32; the six layers around them run fine in fp16. Metric: mean cosine similarity to FP32 on 64 samples.
"""
import torch
from _hazard_common import init, metric, randn
from torch import nn

TUNE = {"dtype": "fp16", "tolerance": 1e-3}
SPLIT = "design"


class ChainMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.up = nn.Linear(64, 64)
        self.down = nn.Linear(64, 64)
        self.out = nn.Sequential(nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                                 nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.down(self.up(self.inp(x))))


def build_model() -> nn.Module:
    model = init(ChainMLP(), seed=11)
    with torch.no_grad():
        model.up.weight.mul_(2e5)  # outputs ~1e5: past fp16's max
        model.down.weight.mul_(1e-5)  # back to ~1
    return model


_X = randn(64, 32, seed=12)
evaluate = metric(build_model, (_X,), "cosine")


def example_inputs():
    return (_X[:8],)

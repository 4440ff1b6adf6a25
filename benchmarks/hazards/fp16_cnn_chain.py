"""fp16 overflow chain in a CNN: `stem` (a cheap 3->8 conv) outputs ~1e5 and feeds `body`, the conv with most
of the FLOPs, which casts that FP32 output to fp16 itself and overflows: both stay FP32, only the convs and the
head after them can run in fp16. Metric: top-1 agreement with FP32 on 64 images (discrete).
"""
import torch
from _hazard_common import init, metric, randn
from torch import nn

TUNE = {"dtype": "fp16", "tolerance": 0.02, "absolute": True}
SPLIT = "heldout"


class ChainCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.body = nn.Conv2d(8, 32, 3, padding=1)
        self.mid = nn.Conv2d(32, 16, 1)
        self.tail = nn.Conv2d(16, 16, 3, padding=1, stride=2)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.body(self.stem(x)))
        h = torch.relu(self.tail(torch.relu(self.mid(h))))
        return self.head(h.mean((2, 3)))


def build_model() -> nn.Module:
    model = init(ChainCNN(), seed=21)
    with torch.no_grad():
        model.stem.weight.mul_(3e5)
        model.body.weight.mul_(1e-5)
    return model


_X = randn(64, 3, 16, 16, seed=22)
evaluate = metric(build_model, (_X,), "agreement")


def example_inputs():
    return (_X[:4],)

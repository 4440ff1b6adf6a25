"""GeGLU in fp16: gate and up projections of ~400 each, so their product (~1e5) overflows in fp16 and
`down_proj` casts it to fp16 itself: down_proj and one of gate/up (so the product computes in FP32) must stay
FP32; q/k-free mixing layers around them run in fp16. Metric: mean cosine to FP32.
"""
import torch
from _hazard_common import init, metric, randn
from torch import nn

TUNE = {"dtype": "fp16", "tolerance": 1e-3}
SPLIT = "heldout"


class GeGLU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(32, 96, bias=False)
        self.up_proj = nn.Linear(32, 96, bias=False)
        self.down_proj = nn.Linear(96, 32, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.gelu(self.gate_proj(x)) * self.up_proj(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Linear(24, 32)
        self.mix = nn.Linear(32, 32)
        self.mlp = GeGLU()
        self.post = nn.Linear(32, 32)
        self.head = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.mix(torch.relu(self.pre(x))))
        return self.head(torch.relu(self.post(self.mlp(h))))


def build_model() -> nn.Module:
    model = init(Net(), seed=41)
    with torch.no_grad():
        model.mlp.gate_proj.weight.mul_(600)
        model.mlp.up_proj.weight.mul_(600)
        model.mlp.down_proj.weight.mul_(1e-5)
    return model


_X = randn(64, 24, seed=42)
evaluate = metric(build_model, (_X,), "cosine")


def example_inputs():
    return (_X[:8],)

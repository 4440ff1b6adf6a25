"""Test model file: float16 overflows in the first Linear (`big`), bf16 and FP32 do not.

Inputs of about 1e2 times weights of about 1e3, summed over 8 features, give
outputs near 1e6, beyond float16's largest value (65504): in fp16 `big`
returns inf and everything after it is inf/NaN. Scaled down by 1e-4 in FP32,
the rest of the network sees values of about 100 and is fine in fp16.

evaluate() is the mean absolute error against the FP32 outputs (lower is
better): 0 for FP32, inf or NaN when `big` runs in fp16.
"""
import torch
from torch import nn


class Overflow(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.big = nn.Linear(8, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.big(x) * 1e-4)


def build_model() -> nn.Module:
    g = torch.Generator().manual_seed(0)
    model = Overflow()
    with torch.no_grad():
        model.big.weight.copy_(1e3 * (1 + torch.rand(4, 8, generator=g)))
        model.big.bias.zero_()
        model.head.weight.copy_(0.01 * torch.randn(3, 4, generator=g))
        model.head.bias.zero_()
    return model.eval()


_X = 1e2 * (1 + torch.rand(16, 8, generator=torch.Generator().manual_seed(1)))
with torch.no_grad():
    _REF = build_model()(_X)


def example_inputs():
    return (_X[:4],)


def evaluate(model: nn.Module) -> float:
    with torch.no_grad():
        return float((model(_X).float() - _REF).abs().mean())

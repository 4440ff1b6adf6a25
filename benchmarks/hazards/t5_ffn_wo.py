"""T5-style feed-forward in fp16: `wo`'s output grows past 65504 (T5's large activations, the reason HF keeps
T5's `wo` in FP32 with `_keep_in_fp32_modules`); the residual add and the RMSNorm after it then see inf.
Two blocks, attention-free; only `wo` of the second block overflows. Metric: mean cosine to FP32.
"""
import torch
from _hazard_common import init, metric, randn
from torch import nn

TUNE = {"dtype": "fp16", "tolerance": 1e-3}
SPLIT = "design"


class RMSNorm(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class FFN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = RMSNorm()
        self.wi = nn.Linear(32, 128, bias=False)
        self.wo = nn.Linear(128, 32, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.wo(torch.relu(self.wi(self.norm(x))))


class T5Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(16, 32)
        self.blocks = nn.Sequential(FFN(), FFN())
        self.final = RMSNorm()
        self.lm = nn.Linear(32, 20)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm(self.final(self.blocks(self.embed(x))))


def build_model() -> nn.Module:
    model = init(T5Stack(), seed=31)
    with torch.no_grad():
        model.blocks[1].wo.weight.mul_(4e4)  # outputs ~1e5
    return model


_X = randn(16, 12, 16, seed=32)
evaluate = metric(build_model, (_X,), "cosine")


def example_inputs():
    return (_X[:2],)

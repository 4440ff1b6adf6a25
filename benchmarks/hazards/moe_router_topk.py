"""MoE router top-k flips in bf16: the router's logits share a large common part (~16) and differ by ~0.05,
below bf16's step at 16 (0.0625), so in bf16 the top-1 expert flips for many tokens and the token goes
through another expert. The router stays FP32; the experts and the head run in bf16. Metric: top-1
agreement of the classifier with FP32 over 256 tokens (discrete).
"""
import torch
from _hazard_common import init, metric, randn
from torch import nn

TUNE = {"dtype": "bf16", "tolerance": 0.02, "absolute": True}
SPLIT = "design"


class MoE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(16, 32)
        self.router = nn.Linear(32, 4)
        self.experts = nn.ModuleList(nn.Linear(32, 32) for _ in range(4))
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.embed(x))
        choice = self.router(h).argmax(-1)
        out = torch.stack([e(h) for e in self.experts], dim=1)
        picked = out.gather(1, choice[:, None, None].expand(-1, 1, out.shape[-1]))[:, 0]
        return self.head(torch.relu(picked))


def build_model() -> nn.Module:
    model = init(MoE(), seed=81)
    with torch.no_grad():
        model.router.weight.mul_(0.05)
        model.router.bias.fill_(16.0)  # a shared offset: the experts' margins sit below bf16's step at 16
    return model


_X = randn(256, 16, seed=82)
evaluate = metric(build_model, (_X,), "agreement")


def example_inputs():
    return (_X[:32],)

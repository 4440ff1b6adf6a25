"""A big-K regression head in bf16: one output summed over K=4096 features that come in identical pairs weighted
+c and -c(1+d) (d ~ 1%), so the prediction is what is left after the pairs cancel, and bf16's rounding of the
head's weights (~0.2% each) moves it by ~20%. The features are small integers (binary inputs through weights in
{-1, 0, 1}), exact in bf16, so only the head must stay FP32: the two feature layers (98% of the FLOPs) can run
in bf16. Metric: mean absolute error relative to FP32's mean |prediction| (lower is better, 0 = FP32).
"""
import torch
from _hazard_common import generator, metric
from torch import nn

TUNE = {"dtype": "bf16", "tolerance": 0.02, "absolute": True, "lower_is_better": True}
SPLIT = "heldout"


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f1 = nn.Linear(16, 64)
        self.f2 = nn.Linear(64, 4096)
        self.head = nn.Linear(4096, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.f2(torch.relu(self.f1(x)))))


def build_model() -> nn.Module:
    model = Regressor()
    g = generator(111)
    with torch.no_grad():
        for layer in (model.f1, model.f2, model.head):
            layer.bias.zero_()
        model.f1.weight.copy_(torch.randint(-1, 2, (64, 16), generator=g).float())
        model.f2.weight[0::2] = torch.randint(-1, 2, (2048, 64), generator=g).float()
        model.f2.weight[1::2] = model.f2.weight[0::2]  # features in identical pairs
        model.head.weight[0, 0::2] = 4.0
        model.head.weight[0, 1::2] = -4.0 * (1 + 0.01 * torch.randn(2048, generator=g))
    return model.eval()


_X = torch.randint(0, 2, (128, 16), generator=generator(112)).float()
evaluate = metric(build_model, (_X,), "rel-mae")


def example_inputs():
    return (_X[:16],)

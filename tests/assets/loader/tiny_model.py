"""A minimal model file following the `mpt` contract (used by tests/core/test_loader.py)."""
import torch
from torch import nn


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return TinyNet()


def example_inputs() -> torch.Tensor:
    return torch.ones(3, 4)


def evaluate(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        out = model(torch.ones(3, 4))
    return (out.argmax(dim=1) == 0).float().mean()

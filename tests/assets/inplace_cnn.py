"""A small ResNet-like CNN: every BatchNorm is followed by an in-place ReLU or an in-place residual add.

In-place ops change the BatchNorm's output tensor after it was made, which is what `mpt inspect` must
not compare against (tests/measure/test_inspection.py).
"""
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, ch: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(ch, ch, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(ch)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(ch, ch, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += x  # in-place residual add, as torchvision's BasicBlock
        return self.relu(out)


class SmallCNN(nn.Module):
    def __init__(self, ch: int = 8, classes: int = 5) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, ch, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(ch)
        self.relu = nn.ReLU(inplace=True)
        self.block = Block(ch)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(ch, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn(self.stem(x)))
        x = self.block(x)
        return self.fc(torch.flatten(self.pool(x), 1))


def build_model() -> nn.Module:
    torch.manual_seed(0)
    model = SmallCNN()
    g = torch.Generator().manual_seed(2)
    for m in model.modules():  # trained-looking statistics: outputs centred on 0, so ReLU zeroes about half
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.normal_(0.0, 0.1, generator=g)
            m.running_var.uniform_(0.5, 1.5, generator=g)
            m.weight.data.uniform_(0.5, 1.5, generator=g)
            m.bias.data.normal_(0.0, 0.1, generator=g)
    return model.eval()


def example_inputs() -> tuple:
    return (torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(3)),)

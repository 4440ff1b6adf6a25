"""Zoo model: ResNet-18 (written here: BasicBlock, BatchNorm, in-place ReLU); metric: top-1 agreement with FP32.

    mpt tune benchmarks/zoo/resnet18.py --dtype bf16 --tolerance 0.01 --out runs/resnet18

torchvision's layout (conv1 7x7/2, maxpool, 4 stages of 2 BasicBlocks, widths 64-128-256-512, global
average pool, fc), 100 classes, 11.2M parameters, written out because the torchvision wheel for this
torch does not import on the CPU-only development machine. Kaiming-normal init (seed 0), and the
residual branch's last BatchNorm gets gamma 0.5 so the stages do not blow up. BatchNorm runs in eval
mode with non-trivial running statistics: build_model() runs 4 seeded batches of 16 images in
train mode with cumulative averaging (momentum None), then switches to eval().

Data: 512 fixed images 3x64x64 (seeded: smooth random fields plus noise, so neighbouring pixels
correlate as in photos), 8 batches of 64. Metric: the share of images whose top-1 class equals the
FP32 model's (1.0 for the FP32 model; higher is better). About 0.5 s per evaluate on 2 cores.

MPT_ZOO_SIZE=tiny: width 8 (8-16-32-64), 16x16 images, 32 of them, 10 classes.
"""
from __future__ import annotations


import torch
from torch import nn

import _shared


def config() -> dict:
    if _shared.tiny():
        return {"width": 8, "image": 16, "images": 32, "batch": 16, "classes": 10}
    return {"width": 64, "image": 64, "images": 512, "batch": 64, "classes": 100}


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample: nn.Module | None = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class ResNet18(nn.Module):
    def __init__(self, width: int = 64, classes: int = 100) -> None:
        super().__init__()
        w = [width, 2 * width, 4 * width, 8 * width]
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        layers = []
        cin = width
        for i, cout in enumerate(w):
            stride = 1 if i == 0 else 2
            layers.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(w[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def data() -> torch.Tensor:
    c = config()
    return _shared.eval_photos(c["images"], c["image"])


def build_model() -> nn.Module:
    c = config()
    with _shared.seeded(0):
        model = ResNet18(c["width"], c["classes"])
        for m in model.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.05)
                nn.init.zeros_(m.bias)
        for m in model.modules():
            if isinstance(m, BasicBlock):
                nn.init.constant_(m.bn2.weight, 0.5)
    # BatchNorm statistics from 4 seeded calibration batches (not the evaluation images).
    return _shared.calibrate_batchnorm(model, _shared.photos(64, c["image"], seed=2), 16)


def _logits(model: nn.Module) -> list[torch.Tensor]:
    return _shared.batched(model, data(), config()["batch"])


def evaluate(model: nn.Module) -> float:
    """Share of the fixed images whose top-1 class matches the FP32 model's."""
    ref = _shared.reference(f"resnet18/{_shared.size()}", build_model, _logits, _shared.device_of(model))
    return _shared.agreement(ref, _logits(model))


def example_inputs() -> tuple[torch.Tensor]:
    return (data()[:8].clone(),)

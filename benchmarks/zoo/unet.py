"""Zoo model: a small UNet (conv, ConvTranspose2d, skip concatenations, BatchNorm, in-place ReLU); metric: cosine.

    mpt tune benchmarks/zoo/unet.py --dtype bf16 --tolerance 2e-4 --out runs/unet

Written here: 3 levels (widths 32-64-128, a 256-wide bottleneck); each level is two conv3x3 ->
BatchNorm -> ReLU(inplace=True); down by MaxPool2d(2), up by ConvTranspose2d(k=2, stride=2), the
upsampled map concatenated (torch.cat, dim 1) with the encoder's map of the same level; a 1x1 conv
head to 4 output channels (a dense prediction, as in segmentation or denoising). 1.9M parameters,
Kaiming-normal init (seed 0). BatchNorm runs in eval mode with non-trivial running statistics:
build_model() runs 4 seeded calibration batches in train mode (cumulative averaging), then eval().

Data: 64 fixed images 3x64x64 (seeded smooth random fields plus noise), 4 batches of 16. Metric: the
mean cosine similarity, per image, between the flattened output map and the FP32 model's (1.0 for
the FP32 model; higher is better).

MPT_ZOO_SIZE=tiny: widths 4-8-16 (bottleneck 32), 16x16 images, 8 of them, 2 output channels.
"""
from __future__ import annotations


import torch
from torch import nn

import _shared


def config() -> dict:
    if _shared.tiny():
        return {"width": 4, "image": 16, "images": 8, "batch": 8, "out": 2}
    return {"width": 32, "image": 64, "images": 64, "batch": 16, "out": 4}


class DoubleConv(nn.Sequential):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class UNet(nn.Module):
    def __init__(self, width: int = 32, cin: int = 3, cout: int = 4) -> None:
        super().__init__()
        w = [width, 2 * width, 4 * width]
        self.enc = nn.ModuleList([DoubleConv(cin, w[0]), DoubleConv(w[0], w[1]), DoubleConv(w[1], w[2])])
        self.pool = nn.MaxPool2d(2)
        self.bottleneck = DoubleConv(w[2], 2 * w[2])
        self.up = nn.ModuleList([nn.ConvTranspose2d(2 * w[2], w[2], 2, stride=2),
                                 nn.ConvTranspose2d(w[2], w[1], 2, stride=2),
                                 nn.ConvTranspose2d(w[1], w[0], 2, stride=2)])
        self.dec = nn.ModuleList([DoubleConv(2 * w[2], w[2]), DoubleConv(2 * w[1], w[1]), DoubleConv(2 * w[0], w[0])])
        self.head = nn.Conv2d(w[0], cout, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for enc in self.enc:
            x = enc(x)
            skips.append(x)
            x = self.pool(x)
        x = self.bottleneck(x)
        for up, dec, skip in zip(self.up, self.dec, reversed(skips), strict=True):
            x = dec(torch.cat([up(x), skip], dim=1))
        return self.head(x)


def data() -> torch.Tensor:
    c = config()
    return _shared.eval_photos(c["images"], c["image"])


def build_model() -> nn.Module:
    c = config()
    with _shared.seeded(0):
        model = UNet(c["width"], 3, c["out"])
        for m in model.modules():
            if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                if m.bias is not None:
                    nn.init.normal_(m.bias, std=0.1)
    return _shared.calibrate_batchnorm(model, _shared.photos(32, c["image"], seed=2), 8)


def _maps(model: nn.Module) -> list[torch.Tensor]:
    return _shared.batched(model, data(), config()["batch"], lambda m, chunk: m(chunk).flatten(1))


def evaluate(model: nn.Module) -> float:
    """Mean cosine similarity of each image's output map to the FP32 model's."""
    ref = _shared.reference(f"unet/{_shared.size()}", build_model, _maps, _shared.device_of(model))
    return _shared.mean_cosine(ref, _maps(model))


def example_inputs() -> tuple[torch.Tensor]:
    return (data()[:4].clone(),)

"""Example model file for mpt: an MLP on raw "sensor" readings, with one spot that bf16 breaks.

    mpt inspect examples/digits_sensor.py
    mpt tune examples/digits_sensor.py

Story: the 8x8 digits are read by a sensor whose raw counts carry a large DC
offset, reading = OFFSET + GAIN * pixel, with pixel in [0, 1], OFFSET = 4096
and GAIN = 16 (readings 4096..4112, un-normalized). The offset/gain
calibration was folded into the first Linear layer (`calib`) at export time:
its bias is about -OFFSET * (row sum of its weight), so in FP32 it cancels the
offset exactly and the rest of the network (hidden1, norm1, hidden2, head)
sees normal-sized activations.

In bfloat16 this collapses: bf16 keeps 8 significant bits, so near 4096 its
spacing is 32, larger than the whole signal (16 counts). Casting the input of
`calib` to bf16 rounds every reading to 4096, and the huge cancelling bias is
itself rounded by several units. With the whole model in bf16 accuracy drops
to about chance; keeping just `calib` in FP32 (input and weights) while
everything after it runs in bf16 gives back the FP32 accuracy. This is the
op a precision tuner must find.

Data: sklearn.datasets.load_digits (bundled with scikit-learn, no download),
fixed stratified 70/30 split (random_state=0).
Weights: weights/digits_sensor.safetensors, made by `python examples/train.py digits_sensor --out examples/weights`.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Iterator

import torch
from torch import nn
import torch.nn.functional as F

NAME = "digits_sensor"
WEIGHTS = Path(__file__).resolve().parent / "weights" / f"{NAME}.safetensors"
EVAL_BATCH = 256
OFFSET = 4096.0  # DC offset of the raw readings, in counts
GAIN = 16.0  # counts per unit of pixel intensity

# Training recipe used by examples/train.py: the network is trained on
# calibrated inputs (train_inputs) and the calibration is then folded into
# `calib` (finalize), which is what gets shipped.
TRAIN = {"epochs": 60, "lr": 2e-3, "weight_decay": 1e-4, "batch_size": 64}


class SensorMLP(nn.Module):
    """(N, 64) raw sensor readings (about 4096..4112) -> (N, 10) logits."""

    def __init__(self) -> None:
        super().__init__()
        self.calib = nn.Linear(64, 128)  # offset removal + gain, folded into the first projection
        self.hidden1 = nn.Linear(128, 128)
        self.norm1 = nn.LayerNorm(128)
        self.hidden2 = nn.Linear(128, 64)
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.calib(x))
        x = torch.relu(self.norm1(self.hidden1(x)))
        x = torch.relu(self.hidden2(x))
        return self.head(x)


Net = SensorMLP


def to_readings(pixels: torch.Tensor) -> torch.Tensor:
    """Pixels in [0, 1] -> raw sensor readings."""
    return pixels * GAIN + OFFSET


def train_inputs(readings: torch.Tensor) -> torch.Tensor:
    """Calibrated inputs used while training (the calibration is folded in afterwards)."""
    return (readings - OFFSET) / GAIN


@torch.no_grad()
def finalize(model: SensorMLP) -> SensorMLP:
    """Fold train_inputs into `calib`: calib'(r) = calib((r - OFFSET) / GAIN) = (W/GAIN) r + b - (OFFSET/GAIN) W 1."""
    w = model.calib.weight.double()
    b = model.calib.bias.double()
    model.calib.bias.copy_(b - (OFFSET / GAIN) * w.sum(dim=1))
    model.calib.weight.copy_(w / GAIN)
    return model


@lru_cache(maxsize=1)
def load_split() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_train, y_train, x_test, y_test); x as (N, 64) float32 raw readings."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = digits.data.astype("float32") / 16.0
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, digits.target, test_size=0.3, random_state=0, stratify=digits.target)
    return (to_readings(torch.from_numpy(x_tr)), torch.from_numpy(y_tr).long(),
            to_readings(torch.from_numpy(x_te)), torch.from_numpy(y_te).long())


def build_model() -> nn.Module:
    from safetensors.torch import load_file

    if not WEIGHTS.is_file():
        raise FileNotFoundError(f"{WEIGHTS} is missing; run "
                                f"`python examples/train.py {NAME} --out examples/weights` to make it")
    model = SensorMLP()
    model.load_state_dict(load_file(str(WEIGHTS)))
    return model.eval()


def _test_batches(model: nn.Module) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(FP32 logits on the CPU, labels) for the held-out split, EVAL_BATCH samples at a time, without grad."""
    _, _, x, y = load_split()
    device = next(model.parameters()).device
    with torch.no_grad():
        for i in range(0, len(x), EVAL_BATCH):
            yield model(x[i:i + EVAL_BATCH].to(device)).float().cpu(), y[i:i + EVAL_BATCH]


def evaluate(model: nn.Module) -> float:
    """Accuracy on the held-out split (540 samples)."""
    correct = sum(int((logits.argmax(dim=-1) == labels).sum()) for logits, labels in _test_batches(model))
    return correct / len(load_split()[3])


def loss(model: nn.Module) -> float:
    """Mean cross-entropy on the held-out split, lower is better (`mpt tune ... --eval loss --lower-is-better`)."""
    total = sum(float(F.cross_entropy(logits, labels, reduction="sum")) for logits, labels in _test_batches(model))
    return total / len(load_split()[3])


def example_inputs() -> tuple:
    """A batch of 8 raw test readings."""
    return (load_split()[2][:8].clone(),)

"""Example model file for mpt: a small CNN on scikit-learn's 8x8 handwritten digits.

    mpt inspect examples/digits_cnn.py
    mpt tune examples/digits_cnn.py

The model file contract: build_model() -> nn.Module (FP32, trained, eval mode),
evaluate(model) -> float (held-out accuracy, higher is better) and
example_inputs() -> tuple (positional args for one forward call).

Data: sklearn.datasets.load_digits (bundled with scikit-learn, no download),
pixels scaled to [0, 1], fixed stratified 70/30 split (random_state=0).
Weights: weights/digits_cnn.safetensors, made by `python examples/train.py digits_cnn --out examples/weights`.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch
from torch import nn

NAME = "digits_cnn"
WEIGHTS = Path(__file__).resolve().parent / "weights" / f"{NAME}.safetensors"
EVAL_BATCH = 256

# Training recipe used by examples/train.py (kept here so the file documents its own weights).
TRAIN = {"epochs": 40, "lr": 3e-3, "weight_decay": 1e-4, "batch_size": 64}


class DigitsCNN(nn.Module):
    """(N, 1, 8, 8) images in [0, 1] -> (N, 10) logits."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.pool = nn.MaxPool2d(2)  # 8x8 -> 4x4
        self.fc1 = nn.Linear(32 * 4 * 4, 32)
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        x = torch.relu(self.fc1(torch.flatten(x, 1)))
        return self.head(x)


Net = DigitsCNN


@lru_cache(maxsize=1)
def load_split() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_train, y_train, x_test, y_test); x as (N, 1, 8, 8) float32 in [0, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = digits.data.astype("float32") / 16.0
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, digits.target, test_size=0.3, random_state=0, stratify=digits.target)

    def images(a):
        return torch.from_numpy(a).reshape(-1, 1, 8, 8)

    return images(x_tr), torch.from_numpy(y_tr).long(), images(x_te), torch.from_numpy(y_te).long()


def build_model() -> nn.Module:
    from safetensors.torch import load_file

    if not WEIGHTS.is_file():
        raise FileNotFoundError(f"{WEIGHTS} is missing; run "
                                f"`python examples/train.py {NAME} --out examples/weights` to make it")
    model = DigitsCNN()
    model.load_state_dict(load_file(str(WEIGHTS)))
    return model.eval()


def evaluate(model: nn.Module) -> float:
    """Accuracy on the held-out split (540 images)."""
    _, _, x, y = load_split()
    device = next(model.parameters()).device
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), EVAL_BATCH):
            logits = model(x[i:i + EVAL_BATCH].to(device))
            correct += int((logits.argmax(dim=-1).cpu() == y[i:i + EVAL_BATCH]).sum())
    return correct / len(y)


def example_inputs() -> tuple:
    """A batch of 8 test images."""
    return (load_split()[2][:8].clone(),)

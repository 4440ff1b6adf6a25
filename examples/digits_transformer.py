"""Example model file for mpt: a tiny transformer encoder classifier on the 8x8 digits.

    mpt inspect examples/digits_transformer.py
    mpt tune examples/digits_transformer.py

Each 8x8 image is a sequence of 8 tokens (its rows) of 8 features: a Linear
embedding to d_model=32, a learned position embedding, a 2-layer
nn.TransformerEncoder (batch_first, 4 heads), mean-pooling over the tokens
and a Linear head returning logits.

Data: sklearn.datasets.load_digits (bundled with scikit-learn, no download),
pixels scaled to [0, 1], fixed stratified 70/30 split (random_state=0).
Weights: weights/digits_transformer.safetensors, made by
`python examples/train.py digits_transformer --out examples/weights`.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch
from torch import nn

NAME = "digits_transformer"
WEIGHTS = Path(__file__).resolve().parent / "weights" / f"{NAME}.safetensors"
EVAL_BATCH = 256
SEQ_LEN, FEATURES, D_MODEL = 8, 8, 32

# Training recipe used by examples/train.py.
TRAIN = {"epochs": 80, "lr": 3e-3, "weight_decay": 1e-4, "batch_size": 64}


class DigitsTransformer(nn.Module):
    """(N, 8, 8) images in [0, 1], rows as tokens -> (N, 10) logits."""

    def __init__(self, d_model: int = D_MODEL, nhead: int = 4, num_layers: int = 2, dim_feedforward: int = 64,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.embed = nn.Linear(FEATURES, d_model)
        self.pos = nn.Parameter(torch.randn(1, SEQ_LEN, d_model) * 0.02)  # learned position embedding
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=dim_feedforward, dropout=dropout,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=num_layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) + self.pos
        h = self.encoder(h)
        return self.head(h.mean(dim=1))


Net = DigitsTransformer


@lru_cache(maxsize=1)
def load_split() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_train, y_train, x_test, y_test); x as (N, 8, 8) float32 in [0, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = digits.data.astype("float32") / 16.0
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, digits.target, test_size=0.3, random_state=0, stratify=digits.target)

    def sequences(a):
        return torch.from_numpy(a).reshape(-1, SEQ_LEN, FEATURES)

    return sequences(x_tr), torch.from_numpy(y_tr).long(), sequences(x_te), torch.from_numpy(y_te).long()


def build_model() -> nn.Module:
    from safetensors.torch import load_file

    if not WEIGHTS.is_file():
        raise FileNotFoundError(f"{WEIGHTS} is missing; run "
                                f"`python examples/train.py {NAME} --out examples/weights` to make it")
    model = DigitsTransformer()
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
    """A batch of 8 test images as (8, 8, 8) token sequences."""
    return (load_split()[2][:8].clone(),)

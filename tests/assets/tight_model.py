"""Test model file for a tight tolerance: evaluate is the cosine similarity of the output with the FP32 output
(baseline 1; bf16 gives 0.99999005, so `--tolerance 9.9e-6` puts the target just above it)."""
import torch
from torch import nn

torch.manual_seed(0)
_X = torch.randn(64, 32)


def build_model():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))


_REF = build_model()(_X).detach()


def evaluate(model):
    with torch.no_grad():
        out = model(_X).float()
    return torch.nn.functional.cosine_similarity(out.flatten(), _REF.flatten(), dim=0).item()


def example_inputs():
    return _X[:8]

"""A valid model file; tests copy it and replace one function at a time."""
import torch
from torch import nn


def build_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).eval()


def example_inputs():
    return (torch.ones(3, 4),)


def evaluate(model):
    with torch.no_grad():
        out = model(torch.ones(3, 4))
    return 1.0 - 0.0 * float(out.sum())

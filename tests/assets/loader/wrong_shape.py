"""A model whose forward fails on its own inputs: one feature too many for its first layer."""
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)  # FORWARD


def build_model():
    return Net()


def example_inputs():
    return (torch.ones(3, 5),)


def run(model):
    return model(torch.ones(3, 5))  # CALL


def evaluate(model):
    return run(model).sum()

"""Control: a small well-scaled MLP classifier where every op runs fine in bf16 (all-low passes: the right
answer is 100% of FLOPs low in 2 evaluations). Metric: top-1 agreement with FP32 on 128 samples (discrete).
"""
from _hazard_common import init, metric, randn
from torch import nn

TUNE = {"dtype": "bf16", "tolerance": 0.02, "absolute": True}
SPLIT = "design"


def build_model() -> nn.Module:
    return init(nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5)), seed=131)


_X = randn(128, 20, seed=132)
evaluate = metric(build_model, (_X,), "agreement")


def example_inputs():
    return (_X[:16],)

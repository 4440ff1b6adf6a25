"""A planted chain (2 fragile linears among 24) as a model file, with knobs for the trust tests.

Environment variables (read at call time):
- MPT_TEST_COUNT: a file; each evaluate() call appends a line (to count evaluations across runs);
- MPT_TEST_NOISE: the amplitude of a seeded noise added to the metric (0: deterministic);
- MPT_TEST_MUTATE: "1" makes evaluate() train the model a step after measuring it;
- MPT_TEST_INTERRUPT_AT: raise KeyboardInterrupt in that evaluate() call (1-based).
"""
import os
import random

import torch

from tuner.testing import PlantedTask

_TASK = PlantedTask(24, 2, samples=256)
_NOISE = random.Random(1234)
_CALLS = [0]


def build_model():
    return _TASK.build()


def evaluate(model):
    _CALLS[0] += 1
    count = os.environ.get("MPT_TEST_COUNT")
    if count:
        with open(count, "a", encoding="utf-8") as fh:
            fh.write("eval\n")
    if str(_CALLS[0]) == os.environ.get("MPT_TEST_INTERRUPT_AT"):
        raise KeyboardInterrupt
    noise = float(os.environ.get("MPT_TEST_NOISE", "0"))
    metric = _TASK.evaluate(model) + (_NOISE.uniform(-1, 1) * noise if noise else 0.0)
    if os.environ.get("MPT_TEST_MUTATE") == "1":
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
    return metric


def planted_inputs():
    return _TASK.example_inputs()

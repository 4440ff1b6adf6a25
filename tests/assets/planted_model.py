"""Test model file: tuner.testing's planted chain, where known op instances must stay FP32.

MPT_TEST_FRAGILE (default 1) sets how many fragile branches the model has:
tune with 1, then check with 2 to simulate a model change that breaks the
committed plan (branches.1 appears and nothing keeps it in FP32).
"""
import os

from tuner.testing import PlantedTask

_TASK = PlantedTask(16, int(os.environ.get("MPT_TEST_FRAGILE", "1")), samples=256)


def build_model():
    return _TASK.build()


def evaluate(model):
    return _TASK.evaluate(model)


def example_inputs():
    return _TASK.example_inputs()

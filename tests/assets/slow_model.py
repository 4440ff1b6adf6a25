"""Test model file for the signal tests: a planted chain whose evaluate() sleeps.

Each evaluate() call appends one line to the file named by MPT_TEST_COUNT (when
set), so a test can count evaluations across an interrupted run and its
--resume. MPT_TEST_SLEEP sets the seconds each evaluate() sleeps (default 0.6).
"""
import os
import time

from tuner.testing import PlantedTask

_TASK = PlantedTask(32, 2, samples=256)


def build_model():
    return _TASK.build()


def evaluate(model):
    count = os.environ.get("MPT_TEST_COUNT")
    if count:
        with open(count, "a", encoding="utf-8") as fh:
            fh.write("eval\n")
    time.sleep(float(os.environ.get("MPT_TEST_SLEEP", "0.6")))
    return _TASK.evaluate(model)


def example_inputs():
    return _TASK.example_inputs()

"""A small planted model file that counts its build_model() calls (for the output-overhead tests).

MPT_TEST_BUILDS: a file; each build_model() call appends a line, so a test
can count builds across a whole `mpt tune` run, CLI included.
"""
import os

from tuner.testing import PlantedTask

_TASK = PlantedTask(8, 1, samples=128)


def build_model():
    count = os.environ.get("MPT_TEST_BUILDS")
    if count:
        with open(count, "a", encoding="utf-8") as fh:
            fh.write("build\n")
    return _TASK.build()


def evaluate(model):
    return _TASK.evaluate(model)


def example_inputs():
    return _TASK.example_inputs()

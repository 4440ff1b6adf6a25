"""planted_model.py whose weights change, not its structure, when MPT_TEST_RETRAINED=1.

The change (as a retraining might make) moves the model's decision into its
head and puts the head's output near 64, where bf16's spacing (0.5) swamps
most of it: a plan tuned on the original weights no longer meets its target, while
the module tree and parameter shapes, which `mpt check` verifies, stay the
same.
"""
import os

import torch

from tuner.testing import PlantedTask


class _Task(PlantedTask):
    def build(self):
        model = super().build()
        if os.environ.get("MPT_TEST_RETRAINED") == "1":
            with torch.no_grad():
                for protos in model.protos:
                    protos.copy_(protos[:1].expand_as(protos))  # the branches no longer tell the classes apart
                model.head.weight.mul_(10.0)
                model.head.bias.fill_(64.0)
        return model


_TASK = _Task(16, int(os.environ.get("MPT_TEST_FRAGILE", "1")), samples=256)


def build_model():
    return _TASK.build()


evaluate = _TASK.evaluate  # the task's methods carry the contract's names
example_inputs = _TASK.example_inputs

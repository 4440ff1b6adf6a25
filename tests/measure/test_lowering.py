"""The weight dtypes a trial stores, predicted from one observation, equal a forward's for every plan; where
a module runs in another module's region (a shared module), there is no prediction."""
import itertools

import pytest

import torch
from torch import nn

from tuner.core.inputs import ModelInputs
from tuner.measure.deployed import weight_dtypes
from tuner.measure.lowering import parameter_uses, predicted_lowered
from tuner.policy.plan import OpInstance, Plan


class Block(nn.Module):
    def __init__(self, helper: list[nn.Module]) -> None:
        super().__init__()
        self.fc, self.norm = nn.Linear(8, 8), nn.LayerNorm(8)
        self.scale = nn.Parameter(torch.ones(8))
        self.helper = helper  # a plain list: not registered under the block

    def forward(self, x):
        y = self.norm(self.fc(x)) * self.scale + x @ self.fc.weight.t()  # fc.weight used twice
        return self.helper[0](y) if self.helper else y


class Net(nn.Module):
    def __init__(self, shared_call: bool = False, foreign_call: bool = False) -> None:
        super().__init__()
        self.extra = nn.Linear(8, 8)  # registered at the root; with foreign_call, run by the blocks
        self.blocks = nn.ModuleList(Block([self.extra] if foreign_call else []) for _ in range(3))
        self.head = nn.Linear(8, 4)
        self.shared_call = shared_call

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
            if self.shared_call:
                x = self.blocks[0].fc(x)  # blocks.0.fc run by an ancestor (the root): its wrapper keeps its region
        return self.head(x)


def plans():
    names = [OpInstance("blocks.1.fc", "linear", 0), OpInstance("blocks.2", "matmul", 0),
             OpInstance("head", "linear", 0), OpInstance("blocks.0", "mul", 0), OpInstance("blocks.0.fc", "linear", 0)]
    for k in range(len(names) + 1):
        for chosen in itertools.combinations(names, k):
            yield Plan(dtype="bf16", preset="torch-cpu", fp32_instances=chosen)


@pytest.mark.parametrize("shared_call", [False, True])
def test_prediction_equals_a_forward_for_every_plan(shared_call):
    torch.manual_seed(0)
    model, inputs = Net(shared_call).eval(), ModelInputs.of((torch.randn(2, 8),))
    uses = parameter_uses(model, Plan(dtype="bf16", preset="torch-cpu"), inputs)
    assert uses is not None
    seen = set()
    for plan in plans():
        predicted = predicted_lowered(model, uses, plan)
        assert predicted == weight_dtypes(model, plan, inputs), plan.fp32_instances
        seen.add(frozenset(predicted))
    assert len(seen) > 3  # the plans do lower different sets


def test_no_prediction_for_a_shared_module_or_other_module_overrides():
    torch.manual_seed(0)
    inputs = ModelInputs.of((torch.randn(2, 8),))
    assert parameter_uses(Net(foreign_call=True).eval(), Plan(dtype="bf16", preset="torch-cpu"), inputs) is None
    model = Net().eval()
    uses = parameter_uses(model, Plan(dtype="bf16", preset="torch-cpu"), inputs)
    assert uses is not None
    assert predicted_lowered(model, uses, Plan(dtype="bf16", preset="torch-cpu", modules=(("head", "fp32"),))) is None
    assert parameter_uses(model, Plan(dtype="bf16", preset="hmp"), inputs) is None  # mpt's engine: no regions

"""Search and deployment agree: `autocast_failures` finds the modules torch.autocast cannot run, so the plan
`tuner.load` runs is one that works on this machine."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tuner
from mpt_cli import exitcodes
from mpt_cli.common import exit_code
from tuner.engine.attach import attached
from tuner.engine.probe import AutocastFixes, autocast_failures, autocast_fixes, with_fp32_modules
from tuner.core.errors import DeployError, UserCodeError
from tuner.core.inputs import ModelInputs
from tuner.policy.plan import OpInstance, Plan

PLAN = Plan(dtype="bf16", preset="torch-cpu")


class AutocastAllergic(nn.Module):
    """Raises only under torch.autocast("cpu"), like oneDNN's bf16 LSTM on a CPU without AVX512-BF16."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_autocast_enabled("cpu"):
            raise RuntimeError("could not create a primitive descriptor for the stand-in primitive\nsecond line")
        return self.lin(x)


class Net(nn.Module):
    def __init__(self, allergic: tuple[str, ...] = ("block.1",)) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 8)
        self.block = nn.Sequential(nn.ReLU(), AutocastAllergic() if "block.1" in allergic else nn.Linear(8, 8))
        self.head = AutocastAllergic() if "head" in allergic else nn.Linear(8, 8)
        self.out = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.out(self.head(self.block(self.embed(x)))) * scale


class RootAllergic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_autocast_enabled("cpu"):
            raise RuntimeError("could not create a primitive descriptor in the root's own code")
        return self.lin(x)


def _x() -> torch.Tensor:
    return torch.randn(4, 8)


def test_names_the_failing_module_and_the_fixed_plan_runs():
    model = Net().eval()
    found = autocast_failures(model, (_x(),), PLAN)
    assert found == {"block.1": "RuntimeError: could not create a primitive descriptor for the stand-in primitive"}
    assert attached(model) is None and "forward" not in model.__dict__  # detached afterwards
    fixed = with_fp32_modules(PLAN, found)
    assert fixed.module_overrides() == {"block.1": torch.float32}
    assert autocast_failures(model, (_x(),), fixed) == {}
    tuner.attach(model, fixed)  # what tuner.load does with it
    with torch.no_grad():
        assert model(_x()).shape == (4, 2)
    tuner.detach(model)


def test_a_plan_that_runs_gives_nothing_and_instance_overrides_are_kept():
    model = Net(allergic=()).eval()
    assert autocast_failures(model, (_x(),), PLAN) == {}
    model = Net().eval()
    plan = Plan(dtype="bf16", preset="torch-cpu", fp32_instances=(OpInstance("embed", "linear", 0),))
    found = autocast_failures(model, ModelInputs(args=(_x(),), kwargs={"scale": 2.0}), plan)
    assert list(found) == ["block.1"]
    fixed = with_fp32_modules(plan, found)
    assert fixed.fp32_instances == plan.fp32_instances


def test_several_modules_up_to_max_modules():
    model = Net(allergic=("block.1", "head")).eval()
    assert list(autocast_failures(model, (_x(),), PLAN)) == ["block.1", "head"]
    with pytest.raises(DeployError) as info:
        autocast_failures(model, (_x(),), PLAN, max_modules=1)
    assert list(info.value.modules) == ["block.1"]
    assert "still failing after keeping 1 modules in FP32" in str(info.value)


def test_a_failure_in_the_roots_own_forward_is_a_deploy_error():
    model = RootAllergic().eval()
    with pytest.raises(DeployError) as info:
        autocast_failures(model, (_x(),), PLAN)
    message = str(info.value)
    assert "cannot run on this machine" in message and "outside any submodule and in no op call" in message
    assert "\n" not in message and "primitive descriptor" in message
    assert isinstance(info.value, RuntimeError) and info.value.modules == {}
    assert exit_code(info.value) == exitcodes.USAGE
    assert attached(model) is None and "forward" not in model.__dict__


class RootBilinear(nn.Module):
    """F.bilinear of a lowered activation and an FP32 input in the model's own forward: torch.autocast on CPU does
    not promote it, so it fails there (and under mpt's engine, which follows the torch-cpu lists)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 4)
        self.w = nn.Parameter(torch.randn(3, 4, 8) / 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        return F.bilinear(h, x, self.w)


def test_a_failing_call_in_the_roots_own_forward_makes_the_root_an_fp32_island():
    model, x = RootBilinear().eval(), _x()
    fixes = autocast_fixes(model, (x,), PLAN)
    assert fixes.modules == {} and fixes.root_calls == (OpInstance("", "bilinear", 0),)
    assert fixes.root_reason.startswith("RuntimeError: All tensors must have the same dtype")
    assert attached(model) is None and "forward" not in model.__dict__
    fixed = fixes.apply(PLAN)
    assert fixed.fp32_instances == (OpInstance("", "bilinear", 0),) and fixed.modules == ()
    assert autocast_fixes(model, (x,), fixed) == AutocastFixes()
    with torch.no_grad():
        ref = model(x)
        for engine in ("auto", "python"):  # the root's own ops FP32, its linear still low
            tuner.attach(model, fixed, engine=engine)
            execution = attached(model)
            assert execution is not None
            if engine == "auto":
                assert execution.fp32_islands == ("",) and execution.fp32_subtrees == ()
            out = model(x)
            tuner.detach(model)
            assert out.dtype == torch.float32 and 0 < (out - ref).abs().max() < 0.05
    with pytest.raises(DeployError, match="autocast_fixes keeps that call FP32"):
        autocast_failures(model, (x,), PLAN)  # its callers add module overrides only


def test_a_failure_that_fp32_has_too_is_the_users_code_not_the_plans():
    class Broken(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("a bug that FP32 does not fix")

    model = nn.Sequential(nn.Linear(8, 8), Broken()).eval()
    with pytest.raises(UserCodeError, match="a bug that FP32 does not fix; it fails in FP32 too") as info:
        autocast_failures(model, (_x(),), PLAN)
    assert "example_inputs()" in str(info.value) and exit_code(info.value) == exitcodes.USER_CODE
    assert attached(model) is None


def test_a_policy_without_a_native_autocast_path_is_not_run():
    model = Net().eval()
    assert autocast_failures(model, (_x(),), Plan(dtype="bf16", preset="hmp")) == {}


LSTM_SCRIPT = r"""
import json, torch
from torch import nn
import tuner
from tuner.engine.attach import attached
from tuner.engine.probe import autocast_failures, with_fp32_modules
from tuner.policy.plan import Plan

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(8, 16, batch_first=True)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        y, _ = self.rnn(x)  # FP32 input: a bf16 one takes another kernel path
        return self.head(y[:, -1])

torch.manual_seed(0)
net, x = Net().eval(), torch.randn(2, 5, 8)
try:
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        net.rnn(x)
    raises = False
except RuntimeError:
    raises = True
plan = Plan(dtype="bf16", preset="torch-cpu")
found = autocast_failures(net, (x,), plan)
tuner.attach(net, with_fp32_modules(plan, found))
with torch.no_grad():
    shape = list(net(x).shape)
print(json.dumps({"raises": raises, "found": found, "shape": shape}))
"""


def test_lstm_under_a_cpu_without_avx512_bf16():
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    proc = subprocess.run([sys.executable, "-c", LSTM_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    if data["raises"]:  # oneDNN cannot build the bf16 LSTM here: the module is named, and the fixed plan runs
        assert list(data["found"]) == ["rnn"] and "RuntimeError" in data["found"]["rnn"]
    else:  # a CPU where torch.autocast runs it
        assert data["found"] == {}
    assert data["shape"] == [2, 4]


def test_the_engine_keeps_no_failed_calls_exception_nor_the_tensors_of_its_frames():
    """The engine remembers which call raised (for `failed_call`) by the exception's id: holding the exception
    would hold its traceback's frames, and every activation in them, for as long as the thread lives."""
    import gc
    import weakref

    from tuner.engine.function_mode import PrecisionEngine

    class Bad(nn.Module):
        def forward(self, x):
            big = torch.randn(256, 256)  # an activation of the failing frame
            kept.append(weakref.ref(big))
            return torch.mm(big, x)  # wrong shape: raises inside the engine's call

    kept: list = []
    engine = PrecisionEngine(Plan(dtype="bf16").policy(), torch.bfloat16, recorder=lambda *a: None)
    with engine:
        try:
            Bad()(torch.randn(3, 3))
        except RuntimeError as exc:
            assert engine.failed_call(exc) is not None  # it does name the call
    gc.collect()
    assert kept[0]() is None, "the failing frame's tensor is still alive"

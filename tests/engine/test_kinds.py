"""The engine's decisions as types: EngineKind for `engine=`, torch.dtypes in Decision, public engine hooks."""
import pytest
import torch
from torch import nn

import tuner
from tuner.core.errors import ConfigError
from tuner.engine.function_mode import PrecisionEngine
from tuner.engine.kind import EngineKind
from tuner.engine.native import ExecutionPath
from tuner.policy.presets import load_preset


@pytest.mark.parametrize("value,kind", [("auto", EngineKind.AUTO), ("python", EngineKind.PYTHON),
                                        ("torch", EngineKind.TORCH), (EngineKind.PYTHON, EngineKind.PYTHON)])
def test_engine_kind_parses_its_values_and_members(value, kind):
    assert EngineKind.parse(value) is kind


@pytest.mark.parametrize("value", ["Python", "fastest", "", None, 1])
def test_unknown_engine_is_refused_with_config_error(value):
    with pytest.raises(ConfigError, match="engine: expected auto, python or torch"):
        EngineKind.parse(value)
    with pytest.raises(ConfigError, match="engine: expected auto, python or torch"):
        tuner.autocast("torch-cpu", engine=value)
    with pytest.raises(ConfigError, match="engine: expected auto, python or torch"):
        tuner.attach(nn.Linear(2, 2), "torch-cpu", engine=value)


def test_public_functions_take_the_enum_as_well_as_its_string():
    model = tuner.attach(nn.Linear(2, 2), "torch-cpu", engine=EngineKind.PYTHON)
    assert tuner.attached(model).path is ExecutionPath.PYTHON
    tuner.detach(model)
    assert tuner.autocast("torch-cpu", engine=EngineKind.PYTHON).engine is not None
    assert tuner.autocast("torch-cpu", engine="torch").engine is None
    assert str(EngineKind.TORCH) == "torch" and f"{EngineKind.AUTO}" == "auto"


def _decisions(fn):
    found = []
    with PrecisionEngine(load_preset("torch-cpu"), torch.bfloat16, verbose=found.append):
        fn()
    return found


def test_decision_carries_torch_dtypes_and_says_when_it_lowered():
    lin = nn.Linear(4, 3)
    (d,) = [d for d in _decisions(lambda: lin(torch.randn(2, 4))) if d.op == "linear"]
    assert d.compute is torch.bfloat16 and d.lowered
    assert d.in_dtypes == (torch.float32,) * 3 and d.in_dtype_names == ("fp32",) * 3
    assert d.compute_name == "bf16"
    x = torch.randn(2, 3)
    (d,) = _decisions(lambda: torch.softmax(x, -1))
    assert d.compute is torch.float32 and not d.lowered and d.compute_name == "fp32"


def test_a_call_without_float_inputs_computes_in_none():
    ints = torch.ones(2, 2, dtype=torch.long)
    (d,) = _decisions(lambda: torch.matmul(ints, ints))
    assert d.compute is None and not d.lowered and d.compute_name == "-" and d.in_dtypes == ()


def test_call_indices_restart_per_forward_unless_the_caller_resets_them():
    model = nn.Sequential(nn.Linear(2, 2))
    x = torch.randn(1, 2)
    for reset_at_root, expected in ((True, [0, 0]), (False, [0, 1])):
        found = []
        eng = PrecisionEngine(load_preset("torch-cpu"), torch.bfloat16, root=model, verbose=found.append,
                              reset_counts_at_root=reset_at_root)
        with eng:
            model(x)
            model(x)
        assert [d.index for d in found if d.op == "linear"] == expected
        eng.reset_counts()
        with eng:
            model(x)
        assert found[-1].index == 0


def test_tracker_can_be_driven_without_global_hooks():
    model = nn.Sequential(nn.Linear(2, 2))
    eng = PrecisionEngine(load_preset("torch-cpu"), torch.bfloat16, root=model)
    eng.tracker.enter_module(model[0])
    assert eng.tracker.current_path() == "0"
    eng.tracker.exit_module(model[0])
    assert eng.tracker.current_path() == "-"

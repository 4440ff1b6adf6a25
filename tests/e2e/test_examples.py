"""The example model files under examples/: the model-file contract, accuracy floors, bf16 behaviour.

Each file is imported by path, the way `mpt inspect/tune model.py` loads it.
digits_sensor carries the property the tuner relies on: under bf16 autocast
its accuracy collapses, and keeping only its `calib` Linear in FP32 restores it.
"""
from __future__ import annotations

import functools
import importlib.util
import math
from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("sklearn")
pytest.importorskip("safetensors")

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
FLOORS = {"digits_cnn": 0.95, "digits_sensor": 0.95, "digits_transformer": 0.90}
NAMES = sorted(FLOORS)
MAX_WEIGHT_BYTES = 200 * 1024


@functools.cache
def load_example(name: str):
    path = EXAMPLES_DIR / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"mpt_test_example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def fp32_accuracy(name: str) -> float:
    ex = load_example(name)
    return ex.evaluate(ex.build_model())


def bf16_accuracy(model: nn.Module, ex) -> float:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return ex.evaluate(model)


def keep_fp32(module: nn.Module) -> None:
    """Run `module` in FP32 (input and weights) even inside a bf16 autocast region."""
    inner = module.forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", enabled=False):
            return inner(x.float())

    module.forward = forward


@pytest.mark.parametrize("name", NAMES)
def test_build_model_is_fp32_module_in_eval_mode(name):
    model = load_example(name).build_model()
    assert isinstance(model, nn.Module)
    assert not model.training
    assert not any(m.training for m in model.modules())
    assert all(p.dtype == torch.float32 for p in model.parameters())


@pytest.mark.parametrize("name", NAMES)
def test_evaluate_meets_accuracy_floor(name):
    acc = fp32_accuracy(name)
    assert isinstance(acc, float)
    assert FLOORS[name] <= acc <= 1.0


@pytest.mark.parametrize("name", NAMES)
def test_evaluate_is_deterministic(name):
    # (how quick evaluate is belongs in benchmarks/, not in a timed test: this box is shared and noisy)
    ex = load_example(name)
    model = ex.build_model()
    assert ex.evaluate(model) == ex.evaluate(model) == fp32_accuracy(name)


@pytest.mark.parametrize("name", NAMES)
def test_example_inputs_run_forward(name):
    ex = load_example(name)
    inputs = ex.example_inputs()
    assert isinstance(inputs, tuple) and inputs
    assert all(isinstance(a, torch.Tensor) and a.dtype == torch.float32 for a in inputs)
    assert inputs[0].shape[0] == 8
    with torch.no_grad():
        out = ex.build_model()(*inputs)
    assert out.shape == (8, 10)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", NAMES)
def test_weights_are_small_safetensors(name):
    ex = load_example(name)
    assert ex.WEIGHTS == EXAMPLES_DIR / "weights" / f"{name}.safetensors"
    assert ex.WEIGHTS.is_file()
    assert ex.WEIGHTS.stat().st_size < MAX_WEIGHT_BYTES
    from safetensors.torch import load_file

    state = load_file(str(ex.WEIGHTS))
    assert set(state) == set(ex.Net().state_dict())


@pytest.mark.parametrize("name", NAMES)
def test_build_model_returns_independent_copies(name):
    ex = load_example(name)
    a, b = ex.build_model(), ex.build_model()
    with torch.no_grad():
        for p in a.parameters():
            p.zero_()
    assert ex.evaluate(b) == fp32_accuracy(name)


@pytest.mark.parametrize("name", ["digits_cnn", "digits_transformer"])
def test_bf16_autocast_costs_little(name):
    ex = load_example(name)
    assert bf16_accuracy(ex.build_model(), ex) >= fp32_accuracy(name) - 0.02


def test_sensor_collapses_under_bf16_autocast():
    ex = load_example("digits_sensor")
    assert bf16_accuracy(ex.build_model(), ex) < 0.5


def test_sensor_recovers_with_calib_in_fp32():
    ex = load_example("digits_sensor")
    model = ex.build_model()
    keep_fp32(model.calib)
    acc = bf16_accuracy(model, ex)
    assert abs(acc - fp32_accuracy("digits_sensor")) <= 0.01


@pytest.mark.parametrize("layer", ["hidden1", "hidden2", "head"])
def test_sensor_other_layers_in_fp32_do_not_help(layer):
    ex = load_example("digits_sensor")
    model = ex.build_model()
    keep_fp32(getattr(model, layer))
    assert bf16_accuracy(model, ex) < 0.5


def test_sensor_inputs_carry_the_dc_offset():
    ex = load_example("digits_sensor")
    (x,) = ex.example_inputs()
    assert x.min() >= ex.OFFSET and x.max() <= ex.OFFSET + ex.GAIN
    # bf16 spacing at the offset exceeds the whole signal: every reading rounds to the offset
    assert torch.all(x.bfloat16().float() == ex.OFFSET)


def test_train_script_lists_every_example():
    spec = importlib.util.spec_from_file_location("mpt_test_examples_train", EXAMPLES_DIR / "train.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    assert sorted(train.EXAMPLES) == NAMES
    for name in NAMES:
        ex = load_example(name)
        cfg = ex.TRAIN
        assert {"epochs", "lr", "weight_decay", "batch_size"} <= set(cfg)
        assert all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in cfg.values())

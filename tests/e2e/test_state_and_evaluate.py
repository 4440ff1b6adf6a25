"""`mpt tune` end to end on the faults of torch's global state and of an evaluate that does not run the model:
leaks are warned once after the run, a half-precision model is exit 4, a model file that leaves torch.autocast
on is exit 2 with nothing written, and an evaluate that never calls forward (another method, a cached trace)
or whose metric ignores a large all-low output error is exit 4 naming evaluate's line."""
from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from mpt_cli import exitcodes
from mpt_cli.main import main
from tuner.core.torch_state import TorchState

CANCEL = Path(__file__).parents[1] / "assets" / "cancel_model.py"
EVALUATE_LINE = CANCEL.read_text().splitlines().index("def evaluate(model):") + 1


@pytest.fixture
def clean_state():
    start = TorchState.capture()
    yield start
    start.restore()


MODEL_FILE = """
import torch
from torch import nn

X = torch.linspace(-2, 2, 64 * 8).reshape(64, 8)


def build_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)){to}


def example_inputs():
    return (X,)


def evaluate(model):
    with torch.no_grad():
        out = model(X.to(next(model.parameters()).dtype)).float()
    {leak}
    return 1.0 - 0.0 * float(out.sum())
"""


def _model_file(tmp_path, *, to: str = "", leak: str = "pass", head: str = ""):
    path = tmp_path / "model.py"
    path.write_text(head + textwrap.dedent(MODEL_FILE).format(to=to, leak=leak))
    return path


def test_cli_prints_the_leak_warning_after_the_run(runner, tmp_path, clean_state):
    path = _model_file(tmp_path, leak="torch.set_default_dtype(torch.float64)")
    res = runner.invoke(main, ["tune", str(path), "--out", str(tmp_path / "out"), "--no-latency"])
    assert res.exit_code == 0, res.output
    assert res.output.count("default dtype float32 -> float64") == 1  # stdout and stderr together
    assert TorchState.capture() == clean_state


def test_cli_refuses_a_half_model_with_exit_4(runner, tmp_path, clean_state):
    path = _model_file(tmp_path, to=".half()")
    res = runner.invoke(main, ["tune", str(path), "--out", str(tmp_path / "out")])
    assert res.exit_code == exitcodes.USER_CODE, res.output
    assert "build_model() returned a model with 4 floating parameter(s)/buffer(s) not in float32" in res.stderr
    assert "(model.py:8)" in res.stderr  # build_model's line
    assert "Traceback" not in res.stderr


def test_cli_refuses_a_model_file_that_leaves_autocast_on_with_exit_2(runner, tmp_path, clean_state):
    path = _model_file(tmp_path, head="import torch\ntorch.autocast('cpu', dtype=torch.bfloat16).__enter__()\n")
    res = runner.invoke(main, ["tune", str(path), "--out", str(tmp_path / "out")])
    assert res.exit_code == exitcodes.USAGE, res.output
    assert "inside an active torch.autocast(cpu)" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("how,fragment", [
    ("encode", "evaluate returned a metric without calling the model (the FP32 baseline)"),
    ("traced", "evaluate returned a metric without calling the model (the FP32 baseline)"),
    ("ignored", "yet evaluate's metric did not change at all"),
])
def test_cli_refuses_an_evaluate_that_does_not_run_the_tuned_forward(runner, tmp_path, monkeypatch, how, fragment):
    monkeypatch.setenv("MPT_EVAL", how)
    path = tmp_path / f"cancel_{how}.py"  # a module name of its own: its trace cache starts empty
    shutil.copy(CANCEL, path)
    res = runner.invoke(main, ["tune", str(path), "--out", str(tmp_path / "out")])
    assert res.exit_code == exitcodes.USER_CODE, res.output
    # (a CPU without fast bf16 kernels is warned about once, before the search: that line may come first)
    first = next(line for line in res.stderr.splitlines() if not line.startswith("mpt: warning: "))
    assert first.startswith("mpt: error: ") and fragment in first and first.endswith(f"(cancel_{how}.py:{EVALUATE_LINE})")
    assert "Traceback" not in res.stderr and not (tmp_path / "out" / "plan.yaml").exists()


def test_cli_tunes_the_same_model_when_evaluate_calls_forward(runner, tmp_path, monkeypatch):
    monkeypatch.setenv("MPT_EVAL", "forward")
    path = tmp_path / "cancel_forward.py"
    shutil.copy(CANCEL, path)
    res = runner.invoke(main, ["tune", str(path), "--out", str(tmp_path / "out"), "--no-latency"])
    assert res.exit_code == exitcodes.OK, res.output
    assert "0 of 2 op instances in FP32" not in res.stdout  # the cancelling linears stay FP32

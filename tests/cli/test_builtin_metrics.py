"""`mpt tune MODEL.py --metric ...`: the built-in fidelity metrics on a model file, through the CLI and tuner.tune."""
from __future__ import annotations

import json
import textwrap

import pytest
import torch
import yaml
from safetensors.torch import save_file

import tuner
from mpt_cli import exitcodes
from tests.cli.test_bad_input import assert_error, mpt
from tuner.core.output_files import MANIFEST_NAME, REFERENCE_NAME

MODEL = textwrap.dedent("""
    import torch
    from torch import nn


    def build_model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 5)).eval()
    """)
BATCHES = textwrap.dedent("""

    def calibration_batches():
        g = torch.Generator().manual_seed(1)
        return [(torch.randn(6, 8, generator=g),) for _ in range(3)]
    """)


def _model(tmp_path, extra=""):
    path = tmp_path / "model.py"
    path.write_text(MODEL + extra)
    return path


@pytest.mark.parametrize("metric", ["agreement", "cosine", "kl", "rel-error"])
def test_tune_with_a_builtin_metric_then_check(runner, tmp_path, metric):
    out = tmp_path / "out"
    res = mpt(runner, "tune", _model(tmp_path, BATCHES), "--metric", metric, "--out", out, "-q", "--no-latency")
    assert res.exit_code == 0, res.output
    plan = yaml.safe_load((out / "plan.yaml").read_text())
    assert plan["model"]["metric"] == metric
    lower = metric in ("kl", "rel-error")
    assert plan["metrics"]["lower_is_better"] is lower and plan["metrics"]["absolute"] is True
    assert plan["metrics"]["baseline"] == (0.0 if lower else 1.0)  # FP32 against its own outputs: exact
    assert REFERENCE_NAME in json.loads((out / MANIFEST_NAME).read_text())["files"]
    check = mpt(runner, "check", out, "--json")
    assert check.exit_code == 0, check.output
    assert json.loads(check.stdout)["metric"] == pytest.approx(plan["metrics"]["tuned"], abs=1e-9)


def test_resume_reads_the_reference_instead_of_computing_it(runner, tmp_path):
    out, model = tmp_path / "out", _model(tmp_path, BATCHES)
    assert mpt(runner, "tune", model, "--metric", "cosine", "--out", out, "-q", "--no-latency").exit_code == 0
    stamp = (out / REFERENCE_NAME).stat().st_mtime_ns
    res = mpt(runner, "tune", model, "--metric", "cosine", "--out", out, "-q", "--no-latency", "--resume")
    assert res.exit_code == 0, res.output
    assert (out / REFERENCE_NAME).stat().st_mtime_ns == stamp
    changed = mpt(runner, "tune", model, "--metric", "kl", "--out", out, "-q", "--resume")
    assert changed.exit_code == exitcodes.USAGE  # another metric is another run: refused like any changed setting


def test_example_inputs_as_a_list_of_batches_and_a_data_file(runner, tmp_path):
    listed = _model(tmp_path, "\n\ndef example_inputs():\n    return [torch.ones(2, 8), torch.zeros(3, 8)]\n")
    res = mpt(runner, "tune", listed, "--metric", "agreement", "--out", tmp_path / "a", "-q", "--no-latency")
    assert res.exit_code == 0, res.output
    save_file({"x": torch.randn(20, 8)}, tmp_path / "d.safetensors")
    res = mpt(runner, "tune", _model(tmp_path), "--metric", "rel-error", "--data", tmp_path / "d.safetensors",
              "--batch-size", "7", "--out", tmp_path / "b", "-q", "--no-latency")
    assert res.exit_code == 0, res.output
    assert yaml.safe_load((tmp_path / "b" / "plan.yaml").read_text())["model"]["data"] == "../d.safetensors"


def test_a_metric_wins_over_evaluate_only_when_named(runner, tmp_path):
    model = _model(tmp_path, BATCHES + "\n\ndef evaluate(model):\n    model(torch.ones(1, 8))\n    return 0.5\n")
    plain = mpt(runner, "tune", model, "--out", tmp_path / "a", "-q", "--no-latency")
    assert plain.exit_code == 0 and yaml.safe_load((tmp_path / "a" / "plan.yaml").read_text())["metrics"][
        "baseline"] == 0.5
    named = mpt(runner, "tune", model, "--metric", "cosine", "--out", tmp_path / "b", "-q", "--no-latency")
    assert named.exit_code == 0 and yaml.safe_load((tmp_path / "b" / "plan.yaml").read_text())["metrics"][
        "baseline"] == 1.0


def test_a_metric_with_nothing_to_run_on_is_bad_input(runner, tmp_path):
    res = mpt(runner, "tune", _model(tmp_path), "--metric", "agreement", "--out", tmp_path / "o", "-q")
    assert_error(res, exitcodes.USAGE, "--data", "calibration_batches()", "example_inputs()")


def test_bad_output_path_and_missing_data_file(runner, tmp_path):
    res = mpt(runner, "tune", _model(tmp_path, BATCHES), "--metric", "cosine", "--output", "hidden.3",
              "--out", tmp_path / "o", "-q")
    assert_error(res, exitcodes.USAGE, "--output", "'hidden.3'")
    res = mpt(runner, "tune", _model(tmp_path), "--metric", "cosine", "--data", tmp_path / "none.safetensors",
              "--out", tmp_path / "p", "-q")
    assert_error(res, exitcodes.USAGE, "--data", "none.safetensors")
    res = mpt(runner, "tune", _model(tmp_path, BATCHES), "--metric", "cosine", "--lower-is-better",
              "--out", tmp_path / "q", "-q")
    assert_error(res, exitcodes.USAGE, "higher-is-better")


def test_tuner_tune_with_a_metric_and_batches():
    def build():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 5)).eval()

    batches = [(torch.randn(4, 8),), (torch.randn(4, 8),)]
    result = tuner.tune(build, metric="kl", example_inputs=batches, max_evals=6)
    assert result.plan.metrics["baseline"] == 0.0 and result.plan.metrics["lower_is_better"] is True
    with pytest.raises(TypeError, match="give evaluate, or metric="):
        tuner.tune(build)

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
from tuner.workspace import reference

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


@pytest.mark.plan
@pytest.mark.parametrize("metric", ["agreement", "cosine", "kl", "rel-error"])
def test_tune_with_a_builtin_metric_then_check(runner, tmp_path, metric):
    out = tmp_path / "out"
    res = mpt(runner, "tune", _model(tmp_path, BATCHES), "--metric", metric, "--out", out, "-q", "--no-latency")
    assert res.exit_code == 0, res.output
    plan = yaml.safe_load((out / "plan.yaml").read_text())
    assert plan["model"]["metric"] == metric
    lower = metric in ("kl", "rel-error")
    assert plan["metrics"]["lower_is_better"] is lower and plan["metrics"]["absolute"] is True
    # FP32 against its own outputs: exact on any CPU, as the metric compares equal rows (issue 47)
    assert plan["metrics"]["baseline"] == (0.0 if lower else 1.0)
    # the reference fits the memory budget: kept where the model runs, no file written (issue 33)
    assert REFERENCE_NAME not in json.loads((out / MANIFEST_NAME).read_text())["files"]
    assert not (out / REFERENCE_NAME).exists()
    check = mpt(runner, "check", out, "--json")
    assert check.exit_code == 0, check.output
    assert json.loads(check.stdout)["metric"] == pytest.approx(plan["metrics"]["tuned"], abs=1e-9)


def test_resume_reads_the_reference_instead_of_computing_it(runner, tmp_path, monkeypatch):
    monkeypatch.setattr(reference, "MEMORY_SHARE", 0.0)  # past the budget: streamed to the file
    out, model = tmp_path / "out", _model(tmp_path, BATCHES)
    assert mpt(runner, "tune", model, "--metric", "cosine", "--out", out, "-q", "--no-latency").exit_code == 0
    assert REFERENCE_NAME in json.loads((out / MANIFEST_NAME).read_text())["files"]
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


@pytest.mark.plan
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


@pytest.mark.plan
def test_tuner_tune_with_a_metric_and_batches():
    def build():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 5)).eval()

    batches = [(torch.randn(4, 8),), (torch.randn(4, 8),)]
    result = tuner.tune(build, metric="kl", example_inputs=batches, max_evals=6)
    assert result.plan.metrics["baseline"] == 0.0 and result.plan.metrics["lower_is_better"] is True
    with pytest.raises(TypeError, match="give evaluate, or metric="):
        tuner.tune(build)


@pytest.mark.parametrize("share", [0.25, 0.0])
def test_the_reference_comes_from_the_baseline_model_and_scores_alike_in_memory_or_streamed(tmp_path, share,
                                                                                          monkeypatch):
    """The baseline evaluation's FP32 model gives the reference (no second FP32 model built); a reference kept
    in memory and one streamed to the file score a lowered model the same."""
    from tuner.core.calibration import function_batches
    from tuner.core.inputs import ModelInputs
    from tuner.measure.fidelity import Metric

    monkeypatch.setattr(reference, "MEMORY_SHARE", share)
    user: dict = {}
    exec(MODEL + BATCHES, user)  # noqa: S102 - the test's own model file text
    build = user["build_model"]
    data = function_batches(user["calibration_batches"], "calibration_batches", ModelInputs.of)
    evaluate = reference.FidelityEvaluate(Metric.KL, data, build, output=None, device="cpu", folder=tmp_path)
    assert evaluate(build()) == 0.0 and evaluate.builds == 0  # FP32 against itself: the baseline
    assert (evaluate.held is None) == (tmp_path / REFERENCE_NAME).is_file() == (share == 0.0)
    low = tuner.attach(build(), "torch-cpu", "bf16")
    fresh = reference.FidelityEvaluate(Metric.KL, data, build, output=None, device="cpu", folder=None)
    assert evaluate(low) == fresh(low) > 0 and fresh.builds == 1  # a lowered model first: FP32 built once


def _lm_data(root):
    """Padded token data without labels."""
    ids = torch.randint(1, 60, (8, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[::2, 9:] = 0
    save_file({"input_ids": ids, "attention_mask": mask}, root / "data.safetensors")
    return ids, mask


def test_perplexity_of_a_causal_lm_tuned_then_checked_to_the_same_number(runner, tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=60, n_embd=16, n_layer=1, n_head=2, n_positions=16, bos_token_id=0,
                                     eos_token_id=0)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    ids, mask = _lm_data(tmp_path)
    out = tmp_path / "out"
    res = mpt(runner, "tune", f"hf:{tmp_path / 'gpt2'}", "--metric", "perplexity", "--data",
              tmp_path / "data.safetensors", "--out", out, "-q", "--no-latency", "--max-evals", "4")
    assert res.exit_code in (0, 3), res.output
    plan = yaml.safe_load((out / "plan.yaml").read_text())
    metrics = plan["metrics"]
    assert plan["model"]["metric"] == "perplexity"
    assert metrics["lower_is_better"] is True and metrics["absolute"] is False and metrics["tolerance"] == 0.01
    model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "gpt2").eval()
    with torch.no_grad():  # the FP32 model's own loss, padding left out
        own = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
    assert metrics["baseline"] == pytest.approx(float(own.exp()), rel=1e-5)
    assert metrics["target"] == pytest.approx(metrics["baseline"] * 1.01)
    check = mpt(runner, "check", out, "--json")
    assert check.exit_code in (0, 3), check.output
    assert json.loads(check.stdout)["metric"] == pytest.approx(metrics["tuned"], rel=1e-9)


def test_perplexity_of_an_encoder_decoder_without_labels_is_bad_input(runner, tmp_path):
    pytest.importorskip("transformers")
    (tmp_path / "bart").mkdir()
    (tmp_path / "bart" / "config.json").write_text(json.dumps({
        "architectures": ["BartForConditionalGeneration"], "model_type": "bart", "is_encoder_decoder": True}))
    _lm_data(tmp_path)
    res = mpt(runner, "tune", f"hf:{tmp_path / 'bart'}", "--metric", "perplexity", "--data",
              tmp_path / "data.safetensors", "--out", tmp_path / "out", "-q")
    err = assert_error(res, exitcodes.USAGE, "no `labels`", "data.safetensors")
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()

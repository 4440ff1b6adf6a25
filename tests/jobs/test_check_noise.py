"""`mpt check` with a noisy `evaluate`: a miss within the baseline's spread is not a regression."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from mpt_cli import exitcodes
from mpt_cli.main import main
from tuner.jobs.check_run import check_plan
from tuner.core.loader import load_user_model
from tuner.workspace.modelref import model_ref_for
from tuner.policy.plan import Plan

# evaluate() returns 1 + a, then 1 - a, then draws in [1 - a, 1 + a]: the baseline's first two samples
# span the whole range, so any later draw lies within the measured spread of the baseline's mean.
NOISY = textwrap.dedent('''
    import os
    import random

    import torch
    from torch import nn

    _rng = random.Random(int(os.environ.get("NOISE_SEED", "0")))
    _calls = []
    A = 0.01


    def build_model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


    def example_inputs():
        return (torch.ones(3, 4),)


    def evaluate(model):
        _calls.append(1)
        if len(_calls) <= 2:
            return 1.0 + (A if len(_calls) == 1 else -A)
        return 1.0 + _rng.uniform(-A, A)
''')


def tuned_plan(tmp_path: Path, source: str, *, tolerance: float = 0.0, noise: float | None = None) -> Path:
    """A plan folder for `source`, written as `mpt tune` would (its ModelRef included)."""
    model_file = tmp_path / "model.py"
    model_file.write_text(source)
    out = tmp_path / "plan"
    out.mkdir()
    user = load_user_model(str(model_file))
    metrics = {"tolerance": tolerance, "absolute": False, "lower_is_better": False}
    if noise is not None:
        metrics["noise"] = noise
    ref = model_ref_for(user, out, build=None, eval=None, inputs=None, model=user.build())
    Plan(dtype="bf16", preset="torch-cpu", metrics=metrics, model=ref).save(out / "plan.yaml")
    return out


def test_repeated_noisy_checks_pass_under_the_hold_rule(runner, tmp_path, monkeypatch):
    out = tuned_plan(tmp_path, NOISY)
    below_target = 0
    for seed in range(6):
        monkeypatch.setenv("NOISE_SEED", str(seed))
        res = runner.invoke(main, ["check", str(out), "--json"])
        assert res.exit_code == exitcodes.OK, res.output
        data = json.loads(res.stdout)
        assert data["spread"] == pytest.approx(0.02) and data["margin"] == pytest.approx(0.02)
        assert "noise range 0.02" in data["verdict"]
        below_target += data["metric"] < data["target"]
    assert below_target, "no run drew below the target: the test does not exercise the hold rule"


def test_verdict_line_reports_the_noise(runner, tmp_path, monkeypatch):
    out = tuned_plan(tmp_path, NOISY)
    monkeypatch.setenv("NOISE_SEED", "0")
    result = check_plan(out)
    assert result.passed and result.spread == pytest.approx(0.02)
    res = runner.invoke(main, ["check", str(out)])
    assert res.exit_code == exitcodes.OK, res.output
    assert res.stdout.startswith("check: PASS ") and "noise range 0.02)" in res.stdout


# evaluate() returns the values of $SEQ in turn (the last one repeats): baseline samples, then the plan's metric.
SEQUENCE = NOISY.replace("def evaluate(model):", "def _noisy(model):") + textwrap.dedent('''

    _SEQ = [float(v) for v in os.environ.get("SEQ", "1").split(",")]


    def evaluate(model):
        _calls.append(1)
        return _SEQ[min(len(_calls), len(_SEQ)) - 1]
''')


@pytest.mark.parametrize("seq,passed,spread", [
    ("1,1,0.9", False, 0.0),                  # deterministic: one extra evaluation, a plain miss
    ("1,1,0.995", True, 0.0),
    ("1.01,0.99,1,1,1,0.975", True, 0.02),    # misses 0.99 by 0.015, within the spread
    ("1.01,0.99,1,1,1,0.96", False, 0.02),    # misses it by 0.03, beyond the spread
])
def test_hold_rule(tmp_path, monkeypatch, seq, passed, spread):
    out = tuned_plan(tmp_path, SEQUENCE, tolerance=0.01)
    monkeypatch.setenv("SEQ", seq)
    result = check_plan(out)
    assert result.passed is passed and result.spread == pytest.approx(spread)
    assert result.baseline == pytest.approx(1.0) and result.target == pytest.approx(0.99)
    assert ("noise range" in result.verdict()) is (spread > 0)
    if passed and result.metric < result.target:
        assert "within noise of target" in result.verdict()


def test_recorded_noise_widens_the_margin(tmp_path, monkeypatch):
    out = tuned_plan(tmp_path, SEQUENCE, tolerance=0.01, noise=0.05)
    monkeypatch.setenv("SEQ", "1,1,0.95")
    result = check_plan(out)
    assert result.spread == 0.0 and result.margin == 0.05 and result.passed

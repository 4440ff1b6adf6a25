"""A forward that writes its output into the dict it was given and returns that dict (sentence-transformers
does): the FP32 reference mpt keeps is a copy, so the next forward cannot rewrite it.

Before, the reference was the very dict every later forward filled: the all-bf16 output error printed 0,
`--rank exact` scored every instance 0 and the search kept 10 of 12 instances in FP32.
"""
from __future__ import annotations

import json
import re
import textwrap

import pytest
import torch
from torch import nn

from mpt_cli import exitcodes
from mpt_cli.main import main
from tuner.core.inputs import ModelInputs
from tuner.measure.inspection import inspect_model
from tuner.measure.ranking import rank_exact
from tuner.policy.presets import load_preset
from tuner.search.candidates import find_candidates
from tuner.testing import PlantedTask

MODEL = textwrap.dedent('''
    import torch
    from torch import nn

    from tuner.testing import PlantedTask

    _TASK = PlantedTask(12, 2, samples=256)


    class Features(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = _TASK.build()

        def forward(self, features):
            features["logits"] = self.net(features["x"])  # the output written into the input dict
            return features


    def build_model():
        return Features().eval()


    def evaluate(model):
        with torch.no_grad():
            preds = model({"x": _TASK.x})["logits"].argmax(-1)
        return float((preds == _TASK.labels).float().mean())


    def example_inputs():
        return ({"x": _TASK.x[:32]},)
''')
FRAGILE = {"net.branches.0:linear#0", "net.branches.1:linear#0"}


class Features(nn.Module):
    def __init__(self, task: PlantedTask) -> None:
        super().__init__()
        self.net = task.build()

    def forward(self, features: dict) -> dict:
        features["logits"] = self.net(features["x"])
        return features


@pytest.fixture(scope="module")
def setup():
    task = PlantedTask(12, 2, samples=64)
    return Features(task).eval(), ModelInputs.of(({"x": task.x[:32]},))


def test_the_reference_is_a_copy_the_all_low_forward_cannot_rewrite(setup):
    model, inputs = setup
    found = find_candidates(model, inputs, load_preset("torch-cpu"), torch.bfloat16, {})
    assert found.ref_out is not inputs.args[0] and found.ref_out["logits"] is not inputs.args[0]["logits"]
    with torch.no_grad():
        fp32 = model({"x": inputs.args[0]["x"]})["logits"]
    assert torch.equal(found.ref_out["logits"], fp32)
    assert found.all_low_error > 0.01  # the planted fragile linears ruin the all-bf16 output

    scores = rank_exact(model, inputs, load_preset("torch-cpu"), torch.bfloat16, list(found.instances),
                        found.ref_out)
    top = sorted(scores, key=scores.get, reverse=True)[:2]
    assert {c.label() for c in top} == FRAGILE and all(s > 0 for s in scores.values())


def test_rank_exact_copies_a_reference_the_caller_left_aliased(setup):
    model, inputs = setup
    found = find_candidates(model, inputs, load_preset("torch-cpu"), torch.bfloat16, {})
    with torch.no_grad():
        aliased = model(inputs.args[0])  # the input dict itself, which every later forward fills again
    scores = rank_exact(model, inputs, load_preset("torch-cpu"), torch.bfloat16, list(found.instances), aliased)
    assert {c.label() for c in sorted(scores, key=scores.get, reverse=True)[:2]} == FRAGILE


def test_inspect_compares_with_a_reference_the_policy_pass_cannot_rewrite(setup):
    model, inputs = setup
    result = inspect_model(model, inputs, "torch-cpu", "bf16")
    assert result.summary.output_error is not None and result.summary.output_error > 0.01


@pytest.mark.plan
def test_cli_tune_of_a_model_that_returns_its_input_dict(runner, tmp_path):
    model = tmp_path / "features.py"
    model.write_text(MODEL)
    out = tmp_path / "out"
    res = runner.invoke(main, ["tune", str(model), "--out", str(out), "--no-latency", "--rank", "exact"])
    assert res.exit_code == exitcodes.OK, res.output
    error = float(re.search(r"all-bf16 output error ([0-9.e+-]+)", res.output).group(1))
    assert error > 0.01, res.output
    report = json.loads((out / "report.json").read_text())
    assert sorted(report["scores"], key=report["scores"].get, reverse=True)[:2] == sorted(FRAGILE)
    assert set(report["fp32_instances"]) == FRAGILE  # exact on any CPU: tuner.testing.PlantedTask

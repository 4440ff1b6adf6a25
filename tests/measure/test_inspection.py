"""`mpt inspect` compares each op with the FP32 value it had when it was made, not after in-place ops changed it."""
from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import tuner.measure.inspection
from mpt_cli.main import main
from tuner.measure.inspection import inspect_model
from tuner.measure.inspection import own_error_key as _by_own_error
from tuner.core.inputs import ModelInputs
from tuner.core.loader import load_user_model

CNN = Path(__file__).parents[1] / "assets" / "inplace_cnn.py"


def _cnn() -> tuple[nn.Module, tuple]:
    user = load_user_model(str(CNN), require_eval=False)
    return user.build(), user.example_inputs()


def _batch_norms(result) -> list:
    records = [r for r in result.records if r.op == "batch_norm"]
    assert len(records) == 3
    return records


def test_batch_norm_before_in_place_relu_shows_its_own_small_error():
    model, inputs = _cnn()
    outs = []
    hooks = [m.register_forward_hook(lambda m, i, o: outs.append(o.detach().clone()))
             for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    result = inspect_model(model, inputs, "torch-cpu", "bf16")
    for h in hooks:
        h.remove()
    # each BatchNorm output is largely negative, so the in-place ReLU after it would change it a lot
    assert all((o < 0).float().mean() > 0.2 for o in outs)
    for r in _batch_norms(result):
        assert r.dtype == "bf16" and r.error < 0.05 and r.local_error < 0.05, r
    assert result.summary.output_error < 0.05
    in_place = [r for r in result.records if r.op in ("relu_", "add_")]
    assert len(in_place) == 4  # replayed on their input as it was before they wrote it
    assert all(r.local_error is not None and r.local_error < 0.05 and r.error < 0.05 for r in in_place)


def test_without_the_copy_the_same_model_shows_an_error_of_about_one(monkeypatch):
    """Guards the test above: a reference kept by reference (as before) is what in-place ops corrupt."""
    model, inputs = _cnn()
    monkeypatch.setattr(tuner.measure.inspection, "_keep", lambda t: t.detach())
    assert all(r.error > 0.5 for r in _batch_norms(inspect_model(model, inputs, "torch-cpu", "bf16")))


def test_inspect_leaves_the_callers_inputs_alone_and_takes_model_inputs():
    class Doubles(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x, *, scale=None):
            x.mul_(2.0)  # a forward that writes its input
            return self.fc(x) * (1.0 if scale is None else scale)

    x = torch.randn(3, 4)
    before = x.clone()
    result = inspect_model(Doubles(), ModelInputs((x,), {"scale": 3.0}), "torch-cpu", "bf16")
    assert torch.equal(x, before)
    assert 0.0 < result.summary.output_error < 0.05  # both runs saw the same input
    assert not any(r.op == "clone" for r in result.records)  # mpt's own copies are not the model's ops


def test_top_ranks_by_the_error_an_op_adds_itself(runner):
    full = json.loads(runner.invoke(main, ["inspect", str(CNN), "--json"]).output)["records"]
    res = runner.invoke(main, ["inspect", str(CNN), "--json", "--top", "4"])
    assert res.exit_code == 0, res.output
    top = json.loads(res.output)["records"]
    keys = [_by_own_error(SimpleNamespace(**r)) for r in top]
    assert len(top) == 4 and keys == sorted(keys, reverse=True)
    assert keys[0] == max(_by_own_error(SimpleNamespace(**r)) for r in full)

    plain = runner.invoke(main, ["inspect", str(CNN), "--top", "4"])
    assert plain.exit_code == 0 and "by own error" in plain.output
    assert "local" in runner.invoke(main, ["inspect", "--help"]).output.split("--top", 1)[1]


def test_top_order_local_first_then_error_nan_first_unknown_last():
    def rec(local, error):
        return SimpleNamespace(local_error=local, error=error)

    records = [rec(0.01, 0.9), rec(0.02, 0.1), rec(None, 0.015), rec(None, None), rec(math.nan, 0.1),
               rec(0.02, 0.5)]
    order = sorted(records, key=_by_own_error, reverse=True)
    assert [(r.local_error, r.error) for r in order][1:] == [
        (0.02, 0.5), (0.02, 0.1), (None, 0.015), (0.01, 0.9), (None, None)]
    assert math.isnan(order[0].local_error)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_residual_add_in_place_does_not_corrupt_the_reference(dtype):
    model, inputs = _cnn()
    bn2 = next(r for r in inspect_model(model, inputs, "torch-cpu", dtype).records
               if r.module == "block.bn2" and r.op == "batch_norm")
    assert bn2.error < 0.05

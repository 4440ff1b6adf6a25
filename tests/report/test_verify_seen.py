"""The report's claims check on the forward that confirmed the plan (issue 44): when the written plan is the
all-low one, its evaluation's first forward on the example inputs (the model as `tuner.load` builds it) is
observed, and the report checks what the plan claims against that, with no verifying forward of its own;
otherwise (another plan written, a first forward on other inputs) the report runs that forward."""
from __future__ import annotations

import traceback

import torch
from torch import nn

import tuner
from tuner.measure import deployed
from tuner.testing import PlantedTask

X = [torch.randn(16, 8, generator=torch.Generator().manual_seed(i)) for i in range(2)]


def _build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 4))


def _counted(monkeypatch) -> list[int]:
    """Calls of `deployed.observe` from the report's code (its verifying forward, the plan pass's weight
    dtypes): the search's own (the result phase's proof of a mixed plan's lowered weights) are not counted."""
    calls: list[int] = []
    real = deployed.observe

    def counted(*args, **kwargs):
        if any("/tuner/report/" in frame.filename for frame in traceback.extract_stack()):
            calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(deployed, "observe", counted)
    return calls


def test_an_all_low_plan_is_checked_on_its_evaluations_first_forward(tmp_path, monkeypatch):
    calls = _counted(monkeypatch)
    res = tuner.tune(_build, metric="cosine", example_inputs=X, tolerance=0.01, progress=False, out=tmp_path)
    assert res.chosen is not None and not res.plan.fp32_instances  # the all-low plan is written
    assert res.deployed is not None and res.deployed.flop_share == 1.0
    assert calls == [] and (tmp_path / "plan.yaml").is_file()


def test_a_first_forward_on_other_inputs_leaves_the_check_to_the_report(tmp_path, monkeypatch):
    calls = _counted(monkeypatch)
    def evaluate(model: nn.Module) -> float:
        with torch.no_grad():
            return float(model(X[1]).sum()) + 100.0  # not the example inputs

    res = tuner.tune(_build, evaluate, lambda: X[0], tolerance=0.01, progress=False, out=tmp_path)
    assert res.chosen is not None and res.deployed is None
    assert len(calls) == 1  # the report's verifying forward


def test_a_mixed_plan_is_checked_by_the_reports_own_forward(tmp_path, monkeypatch):
    calls = _counted(monkeypatch)
    task = PlantedTask(8, 1, samples=128)
    res = tuner.tune(task.build, task.evaluate, task.example_inputs, tolerance=0.002, progress=False, out=tmp_path)
    assert res.chosen is not None and res.plan.fp32_instances and res.deployed is None
    assert len(calls) == 1

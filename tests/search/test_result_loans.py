"""The result phase's recorded forward and the proof of the lowered weights share one loan of the model, so
the keeper reads every weight byte once after them, not twice (GPT-2 774M: 3 GB a pass, issue 44)."""
import torch
from torch import nn

import tuner
from tuner.core.fingerprint import ModelState
from tuner.search.session import TuneSession
from tuner.testing import PlantedTask


def _in_result_phase(monkeypatch) -> tuple[list[bool], list[int]]:
    """([inside the result phase?], one entry per full capture of the model made there): TuneSession.result
    and ModelState.capture watched."""
    full: list[int] = []
    inside = [False]
    capture, result = ModelState.capture.__func__, TuneSession.result

    def counted(cls, model, *, since=None, changed=(), known=None):
        if inside[0] and since is None:
            full.append(1)
        return capture(cls, model, since=since, changed=changed, known=known)

    def timed(self, *args, **kwargs):
        inside[0] = True
        try:
            return result(self, *args, **kwargs)
        finally:
            inside[0] = False

    monkeypatch.setattr(ModelState, "capture", classmethod(counted))
    monkeypatch.setattr(TuneSession, "result", timed)
    return inside, full


def test_the_result_phase_reads_the_weights_once(monkeypatch):
    _, full = _in_result_phase(monkeypatch)
    task = PlantedTask(8, 1, samples=128)
    res = tuner.tune(task.build, task.evaluate, task.example_inputs, tolerance=0.002, progress=False)
    assert res.chosen is not None and res.recorded is not None  # a plan was chosen, recorded and proven
    assert len(full) == 1


def test_a_tune_that_writes_the_all_low_plan_reuses_the_candidates_recorded_forward(monkeypatch):
    """The candidates' recorded forward is the all-low plan's: when that plan is written, the result phase
    records no forward of its own, and the record it reuses is the one a forward of the written plan gives."""
    from tuner.measure.recorded import record_plan
    from tuner.search import session

    calls = []

    def counted(model, plan, inputs):
        calls.append(plan)
        return record_plan(model, plan, inputs)

    monkeypatch.setattr(session, "record_plan", counted)
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))

    def build():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))

    def evaluate(model):
        with torch.no_grad():
            return float(model(x).abs().mean()) + 1.0

    res = tuner.tune(build, evaluate, lambda: (x,), tolerance=0.5, progress=False)
    assert res.chosen is not None and not res.plan.fp32_instances  # the all-low plan passed and is written
    assert calls == []
    assert res.recorded == record_plan(build(), res.plan, (x,))


def test_a_tune_that_writes_the_all_low_plan_runs_no_forward_in_its_result_phase(monkeypatch):
    """The all-low plan's proof of its lowered weights is the candidates phase's first look (the same FP32
    weights, plan and inputs): the result phase lends no model for a forward, so no pass over the weights
    follows, and what it reports lowered is what a forward of the written plan observes."""
    from tuner.measure.deployed import weight_dtypes

    forwards: list[int] = []
    inside, full = _in_result_phase(monkeypatch)
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))

    class Counted(nn.Sequential):
        def forward(self, x):
            if inside[0]:
                forwards.append(1)
            return super().forward(x)

    def build():
        torch.manual_seed(0)
        return Counted(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))

    def evaluate(model):
        with torch.no_grad():
            return float(model(x).abs().mean()) + 1.0

    res = tuner.tune(build, evaluate, lambda: (x,), tolerance=0.5, progress=False)
    assert res.chosen is not None and not res.plan.fp32_instances  # the all-low plan passed and is written
    assert forwards == [] and full == []
    assert res.lowered and res.lowered == weight_dtypes(build(), res.plan, (x,))

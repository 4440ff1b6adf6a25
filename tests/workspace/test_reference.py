"""A built-in metric's reference pass gives the tune its FP32 output on the example inputs (issue 44): the
candidates phase runs no FP32 forward of its own when the example inputs are the first calibration batch."""
import torch
from torch import nn

import tuner
from tuner.core.inputs import ModelInputs
from tuner.measure.fidelity import Metric
from tuner.search import candidates
from tuner.search.builtin_metric import _batches
from tuner.workspace.reference import FidelityEvaluate, first_output_of


def _build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 3))


BATCHES = [torch.randn(5, 8, generator=torch.Generator().manual_seed(i)) for i in range(2)]


def _fidelity() -> FidelityEvaluate:
    return FidelityEvaluate(Metric("cosine"), _batches(BATCHES), _build, output=None, device="cpu", folder=None)


def test_the_first_batch_output_is_kept_for_a_tune_and_given_once_for_those_inputs_alone():
    evaluate = _fidelity()
    evaluate(_build())
    assert evaluate.first_output(ModelInputs.of((BATCHES[0],))) is None  # nobody asked: nothing kept
    evaluate = _fidelity()
    given = first_output_of(evaluate)
    assert given is not None
    evaluate(_build())
    assert given(ModelInputs.of((BATCHES[1],))) is None  # other inputs: not theirs (and dropped)
    evaluate = _fidelity()
    given = first_output_of(evaluate)
    evaluate(_build())
    out = given(ModelInputs.of((BATCHES[0].clone(),)))
    with torch.no_grad():
        assert torch.equal(out, _build()(BATCHES[0]))
    assert given(ModelInputs.of((BATCHES[0],))) is None  # given once
    assert first_output_of(lambda model: 1.0) is None


def test_a_builtin_metric_tune_runs_no_fp32_forward_to_find_candidates(monkeypatch):
    calls = []
    real = candidates.call_forward

    def counted(model, inputs, **kwargs):
        calls.append(1)
        return real(model, inputs, **kwargs)

    monkeypatch.setattr(candidates, "call_forward", counted)
    res = tuner.tune(_build, metric="cosine", example_inputs=BATCHES, tolerance=0.01, progress=False)
    assert res.chosen is not None and len(calls) == 1  # the recorded forward alone
    calls.clear()
    tuner.tune(_build, lambda model: float(model(BATCHES[0]).sum()), lambda: BATCHES[0], tolerance=0.01,
               progress=False)
    assert len(calls) == 2  # a user's evaluate: the FP32 forward and the recorded one

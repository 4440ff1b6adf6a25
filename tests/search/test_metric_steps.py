"""Discrete metrics: the step they move in, and the note when the tolerance spans only a few steps."""
import torch
from torch import nn

import tuner
from tuner.search.noise import coarse_metric_note, metric_step


def accuracy(correct: int, total: int) -> float:
    return float(torch.tensor(correct / total, dtype=torch.float32))  # as an evaluate computes it


def test_the_step_of_an_accuracy_over_1152_samples_is_found_through_float32_rounding():
    values = [accuracy(c, 1152) for c in (954, 948, 951, 953)]
    step = metric_step(values)
    assert step is not None and abs(step - 1 / 1152) < 1e-6


def test_a_continuous_metric_has_no_step():
    assert metric_step([0.99931, 0.99871234, 0.9990017, 0.99999]) is None
    assert metric_step([0.5, 0.6]) is None  # too few values to tell


def test_the_note_names_how_many_steps_the_tolerance_allows():
    values = [accuracy(c, 1152) for c in (954, 948, 953)]
    note = coarse_metric_note(values, allowed=1.5 / 1152)
    assert note is not None and "allows 1.5 of them" in note
    assert coarse_metric_note(values, allowed=40 / 1152) is None  # plenty of steps: no note


def test_under_training_the_note_suggests_no_builtin_metric():
    """Issue 45: a built-in metric trains nothing, so a training tune's note points at evaluate's own continuous
    metric and at --seeds instead."""
    values = [accuracy(c, 1152) for c in (954, 948, 953)]
    note = coarse_metric_note(values, allowed=1.5 / 1152, training=True)
    assert note is not None and "--metric" not in note and "--seeds" in note


def test_a_builtin_agreement_knows_its_step_however_few_evaluations_ran():
    """A classifier judged on 16 samples moves 1/16 = 6.25% per changed answer against a 1% tolerance: the note
    comes after 2 evaluations, where the values alone (too few to show a step) could not tell."""
    def build():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).eval()

    batches = [(torch.randn(8, 8, generator=torch.Generator().manual_seed(i)),) for i in range(2)]
    result = tuner.tune(build, metric="agreement", example_inputs=batches, max_evals=2)
    assert result.evals == 2
    assert any("steps of 0.0625 and the tolerance allows 0.2 of them" in n for n in result.notes), result.notes

"""Discrete metrics: the step they move in, and the note when the tolerance spans only a few steps."""
import torch

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

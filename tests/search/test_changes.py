"""Trial labels say what changed from the trial before (tuner.search.changes), counted as the plan records them."""
import re

import pytest

import tuner
from tuner.search.changes import Change, compress
from tuner.measure.recorded import record_plan
from tuner.testing import PlantedTask


def test_sibling_paths_are_written_once_with_a_star_for_indices():
    labels = ["layer3.0.conv2:conv2d#0", "layer3.1.conv2:conv2d#0", "layer3.12.conv2:conv2d#0",
              "fc:linear#0", "(root):add#3", "layer10.conv:conv2d#1"]
    assert compress(labels) == ["layer3.*.conv2:conv2d#0 ×3", "(root):add#3", "fc:linear#0",
                                "layer10.conv:conv2d#1"]  # a name ending in digits is no index


def test_change_text_lists_what_was_added_and_removed_and_the_recorded_count():
    change = Change.between(["fc:linear#0", "a:linear#0"], ["a:linear#0", "b.0.c:linear#0", "b.1.c:linear#0"],
                            kept=2)
    assert (change.added, change.removed) == (("b.0.c:linear#0", "b.1.c:linear#0"), ("fc:linear#0",))
    assert change.text("bf16") == "+2 FP32: b.*.c:linear#0 ×2; -1: fc:linear#0; 2 FP32 (3 tried, 1 change nothing)"
    assert Change.between(None, []).text("fp16") == "all eligible in fp16"
    assert Change.between(["x:linear#0"], []).text("bf16") == "-1: all eligible in bf16"
    many = Change.between([], [f"m{i}:linear#0" for i in range(5)])
    assert many.text("bf16") == "+5 FP32: m0:linear#0, m1:linear#0, m2:linear#0 ...; 5 FP32"
    with pytest.raises(ValueError, match="kept"):
        Change(("a",), (), 1, kept=2)


def test_each_trial_label_is_the_change_from_the_trial_before(monkeypatch):
    import tuner.search.session as session

    counts = []  # the recorded forwards that count a plan's FP32 instances: one, for the trial whose plan is written
    monkeypatch.setattr(session, "record_plan", lambda *a: counts.append(a) or record_plan(*a))
    task = PlantedTask(12, 2, samples=256)
    result = tuner.tune(task.build, task.evaluate, task.example_inputs, tolerance=0.002)
    searched = [t for t in result.trials if not t.baseline]
    assert len(searched) >= 3 and any(not t.passed and t.fp32 for t in searched)
    assert len(counts) == 1
    labels = [t.label for t in searched]
    assert len(set(labels[1:])) == len(labels) - 1, labels  # not the same first modules on every line
    before: set[str] = set()
    for t in searched:
        now = set(t.fp32)
        added = re.search(r"^\+(\d+) FP32", t.label)
        removed = re.search(r"(?:^|; )-(\d+):", t.label)
        assert (int(added.group(1)) if added else 0) == len(now - before), t.label
        assert (int(removed.group(1)) if removed else 0) == len(before - now), t.label
        if t.n == result.chosen:  # counted as the plan records it: what the summary counts
            assert re.search(rf"; {t.kept} FP32", t.label) and t.kept <= len(now), t.label
        elif now:  # any other trial's label counts the instances it tried
            assert t.kept is None and re.search(rf"; {len(now)} FP32$", t.label), t.label
        before = now
    chosen = next(t for t in result.trials if t.n == result.chosen)
    assert chosen.kept == len(result.plan.fp32_instances)  # the chosen trial counts as the summary does

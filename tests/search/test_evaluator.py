"""Evaluator: the one place `evaluate` runs: journal, bounds, counting, isolation and events."""
from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from tuner.core.errors import UserCodeError
from tuner.core.inputs import ModelInputs
from tuner.measure.shares import Shares
from tuner.policy.plan import OpInstance, Plan
from tuner.search.evaluator import Bounds, Evaluator, trial_key
from tuner.search.noise import Acceptance
from tuner.search.results import EventKind, StopReason, Trial, TuneEvent
from tuner.search.strategy import SearchStopped
from tuner.workspace.journal import Journal, RunFingerprint
from tuner.workspace.keeper import ModelKeeper

PLAN = Plan(fp32_instances=(OpInstance("0", "linear", 0),))
ACCEPT = Acceptance(target=0.5)


def build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4))


class Counting:
    """An evaluate that counts its calls and returns the metrics it is given, in turn."""

    def __init__(self, *metrics: float) -> None:
        self.metrics = list(metrics)
        self.calls = 0

    def __call__(self, model: nn.Module) -> float:
        self.calls += 1
        with torch.no_grad():
            model(torch.ones(1, 4))  # an evaluate must call the model (see test_evaluate_exercises)
        return self.metrics.pop(0)


def evaluator(evaluate, tmp_path=None, *, resume=False, **bounds) -> tuple[Evaluator, list[TuneEvent]]:
    events: list[TuneEvent] = []
    journal = None
    if tmp_path is not None:
        journal = Journal(tmp_path / "journal.jsonl", RunFingerprint(source="s", weights="w", settings={}),
                          resume=resume)
    bound = Bounds(bounds.pop("started", time.monotonic()), **bounds)
    return Evaluator(evaluate, ModelKeeper(build), bound, journal=journal, emit=events.append), events


def test_trials_are_numbered_counted_and_reported():
    ev, events = evaluator(Counting(1.0, 1.0, 0.7, 0.2))
    ev.baseline(), ev.baseline()
    passed = ev.trial(PLAN, "one in FP32", Shares(), ACCEPT)
    failed = ev.trial(Plan(), "all low", Shares(), ACCEPT)
    assert [t.n for t in ev.trials] == [1, 2, 3, 4] and ev.evals == 4
    assert [t.label for t in ev.trials[:2]] == ["FP32 baseline run 1", "FP32 baseline run 2"]
    assert passed.passed and passed.fp32 == ("0:linear#0",) and not failed.passed
    kinds = [e.kind for e in events]
    assert kinds == [EventKind.EVALUATING, EventKind.TRIAL] * 4
    assert events[4].payload.n == 3 and events[4].payload.label == "one in FP32"
    assert events[5].payload is passed


def test_the_journal_answers_a_trial_made_before_without_evaluating(tmp_path):
    first, _ = evaluator(Counting(1.0, 0.7), tmp_path)
    first.baseline()
    first.trial(PLAN, "one in FP32", Shares(), ACCEPT)
    again = Counting()
    ev, events = evaluator(again, tmp_path, resume=True)
    base = ev.baseline()
    trial = ev.trial(PLAN, "one in FP32", Shares(), ACCEPT)
    assert again.calls == 0 and base.from_journal and trial.from_journal
    assert (base.metric, trial.metric, trial.passed, trial.n) == (1.0, 0.7, True, 2)
    assert [e.kind for e in events] == [EventKind.TRIAL, EventKind.TRIAL]  # nothing evaluated
    assert ev.journal is not None and ev.journal.get(trial_key(("0:linear#0",))) is not None
    assert ev.journal.get("baseline#1") is not None


def test_max_evals_stops_a_trial_but_never_the_baseline():
    ev, _ = evaluator(Counting(1.0, 1.0, 1.0, 0.9), max_evals=3)
    ev.baseline(), ev.baseline()
    ev.trial(PLAN, "t", Shares(), ACCEPT)
    with pytest.raises(SearchStopped) as stop:
        ev.trial(Plan(), "t", Shares(), ACCEPT)
    assert stop.value.reason is StopReason.MAX_EVALS and ev.evals == 3
    ev.baseline()  # the baseline is not bounded
    assert ev.evals == 4


def test_the_time_budget_counts_from_the_start():
    ev, _ = evaluator(Counting(1.0), started=time.monotonic() - 60, time_budget=30)
    ev.baseline()
    with pytest.raises(SearchStopped) as stop:
        ev.trial(PLAN, "t", Shares(), ACCEPT)
    assert stop.value.reason is StopReason.TIME_BUDGET


def test_a_trial_that_raises_or_gives_nan_fails_and_the_baseline_raising_propagates():
    def evaluate(model):
        raise RuntimeError("boom\nmore")

    RAISES_AT = evaluate.__code__.co_firstlineno + 1
    ev, _ = evaluator(evaluate)
    trial = ev.trial(PLAN, "t", Shares(), ACCEPT)
    assert not trial.passed and trial.metric is None
    assert trial.error == f"evaluate raised RuntimeError: boom (test_evaluator.py:{RAISES_AT})"  # names the call
    with pytest.raises(RuntimeError):
        ev.baseline()
    nan, _ = evaluator(Counting(float("nan")))
    assert nan.trial(PLAN, "t", Shares(), ACCEPT).error == "metric is nan"
    with pytest.raises(UserCodeError, match="must be finite"):
        evaluator(Counting(float("inf")))[0].baseline()


def test_every_trial_gets_the_model_as_built_with_its_plan_attached_then_detached():
    seen: list[tuple[bool, bool]] = []

    def evaluate(model):
        from tuner.engine.attach import attached

        seen.append((attached(model) is not None, isinstance(model[0], nn.Linear)))
        with torch.no_grad():
            model(torch.ones(1, 4))
        model[0] = nn.Identity()  # a "fold" the keeper must undo
        return 1.0

    ev, _ = evaluator(evaluate)
    ev.baseline()
    ev.trial(PLAN, "t", Shares(), ACCEPT)
    assert seen == [(False, True), (True, True)]
    assert ev.keeper.rebuilds == 2 and isinstance(ev.keeper.model[0], nn.Linear)
    from tuner.engine.attach import attached

    assert attached(ev.keeper.model) is None


def test_bounds_are_validated():
    with pytest.raises(ValueError):
        Bounds(0.0, max_evals=0)
    with pytest.raises(ValueError):
        Bounds(0.0, time_budget=0)


def test_an_event_carries_the_payload_its_kind_says():
    with pytest.raises(TypeError, match="trial event carries a Trial"):
        TuneEvent(EventKind.TRIAL, None)
    TuneEvent(EventKind.TRIAL, Trial(1, "x", (), 1.0, True, 0.0, Shares()))


def test_the_first_look_is_the_all_low_forward_the_guide_and_the_lowered_prediction_need():
    calls: list[int] = []

    class Counted(nn.Sequential):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            calls.append(1)
            return super().forward(x)

    torch.manual_seed(0)
    keeper = ModelKeeper(lambda: Counted(nn.Linear(4, 4)))
    ev = Evaluator(Counting(), keeper, Bounds(time.monotonic()))
    inputs, low = ModelInputs.of((torch.randn(3, 4),)), Plan(dtype="bf16", preset="torch-cpu")
    with torch.no_grad():
        ref = keeper.model(inputs.args[0])
    calls.clear()
    assert ev.first_look(low, inputs) and len(calls) == 1
    first = ev.output_error(low, ref)  # the look's own output: no forward of its own
    assert len(calls) == 1 and ev.forward_s > 0
    assert ev.lowered(low) == {"0.weight": torch.bfloat16, "0.bias": torch.bfloat16}  # from the look's uses
    assert len(calls) == 1
    again = ev.output_error(low, ref)  # kept for one use only: the second runs
    assert len(calls) == 2 and first == pytest.approx(again, rel=1e-6) and first > 0
    assert keeper.rebuilds == 0


def test_a_plan_that_fails_to_run_leaves_the_first_look_empty_handed():
    class NoLowInput(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.lin(x)
            if y.dtype != torch.float32:
                raise RuntimeError("no kernel for this dtype")  # a kernel this machine lacks, say
            return y

    keeper = ModelKeeper(lambda: NoLowInput())
    ev = Evaluator(Counting(), keeper, Bounds(time.monotonic()))
    assert not ev.first_look(Plan(dtype="bf16", preset="torch-cpu"), ModelInputs.of((torch.randn(2, 4),)))
    assert ev.inputs is None and keeper.rebuilds == 0


def test_the_elements_evaluate_feeds_the_model_are_counted_journaled_and_resumed(tmp_path):
    """What sizes the search's guide (tuner.search.guide.guide_limits) is a count a rerun gives again: the
    tensor elements evaluate passes to the model's forward, positional and keyword, over all its calls."""
    def evaluate(model: nn.Module) -> float:
        with torch.no_grad():
            for _ in range(3):
                model(torch.ones(2, 4))  # 8 elements a call
            model.forward(torch.ones(5, 4))  # not model(...): no hook sees it, so it is not counted
        return 1.0

    ev, _ = evaluator(evaluate, tmp_path)
    assert ev.baseline().fed == 24
    assert ev.trial(PLAN, "one in FP32", Shares(), ACCEPT).fed == 24
    again, _ = evaluator(Counting(), tmp_path, resume=True)
    resumed = again.baseline(), again.trial(PLAN, "one in FP32", Shares(), ACCEPT)
    assert [t.from_journal for t in resumed] == [True, True] and [t.fed for t in resumed] == [24, 24]


def test_an_evaluation_from_the_journal_leaves_the_generators_as_it_left_them(tmp_path):
    """A resumed run goes on drawing where the interrupted one was (issue 34): the generators an evaluation
    moved, torch's global one and one its closure holds, are journaled and put back when it is replayed."""
    import random

    own = random.Random(0)

    def draws(model: nn.Module) -> float:
        with torch.no_grad():
            model(torch.ones(1, 4))
        return float(torch.rand(())) + own.random()

    ev, _ = evaluator(draws, tmp_path)
    ev.baseline(), ev.trial(PLAN, "one in FP32", Shares(), ACCEPT)
    left = torch.get_rng_state(), own.getstate()
    torch.manual_seed(0), own.seed(1)  # a new process: its generators elsewhere
    again, _ = evaluator(draws, tmp_path, resume=True)
    resumed = again.baseline(), again.trial(PLAN, "one in FP32", Shares(), ACCEPT)
    assert all(t.from_journal for t in resumed)
    assert torch.equal(torch.get_rng_state(), left[0]) and own.getstate() == left[1]

"""`--resume` after an interrupt replays the interrupted run (issue 34): interrupted at evaluation k of n (k
finished and journaled, n the evaluations the run makes uninterrupted), the resumed run makes exactly n - k
evaluations, takes the k from the journal, and reaches the trials of the uninterrupted run with their metrics.

Each run starts as a fresh process does: torch's generator at one seed, the evaluate's own generator new.
"""
from __future__ import annotations

import functools
import itertools
import json
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from tuner.options.tune import TuneOptions
from tuner.search.results import EventKind, StopReason, TuneEvent, TuneResult
from tuner.search.session import tune
from tuner.testing import PlantedTask
from tuner.workspace.journal import Journal, RunFingerprint

TASK = PlantedTask(12, 2, samples=64)  # thorough: 5 evaluations when evaluate is deterministic, 9 when noisy
OPTIONS = TuneOptions(thorough=True, tolerance=0.01)
FINGERPRINT = RunFingerprint(source="planted", weights="w")
PROCESS_SEED = 1234  # torch's generator as a new process finds it (the same in every process)
PROCESSES = itertools.count()  # Python's and NumPy's global generators: seeded anew by each process


class Counted:
    """An evaluate that counts its calls and raises KeyboardInterrupt (Ctrl-C) in call `stop` + 1.

    `reseeds`: seeds torch's generator and draws from it in every call, as an evaluate that shuffles its data
    with a fixed seed does (deterministic: one FP32 run settles the baseline). `noisy`: adds a draw of a
    generator its closure holds, never reseeded (the baseline is measured 5 times)."""

    def __init__(self, kind: str, stop: int | None = None) -> None:
        self.calls = 0
        self.run = {"reseeds": self._reseeds, "noisy": self._noisy, "caches": self._caches}[kind](stop)

    def _count(self, stop: int | None) -> None:
        self.calls += 1
        if stop is not None and self.calls > stop:
            raise KeyboardInterrupt

    def _reseeds(self, stop: int | None) -> Callable[[nn.Module], float]:
        def evaluate(model: nn.Module) -> float:
            self._count(stop)
            torch.manual_seed(0)
            return TASK.evaluate(model) + 0.0 * float(torch.rand(()))
        return evaluate

    def _caches(self, stop: int | None) -> Callable[[nn.Module], float]:
        """Draws its data from torch's generator on its first call in a process and keeps it (deterministic: one
        FP32 run settles the baseline); a resumed process's first call draws other data than the journal's."""
        kept: dict[str, torch.Tensor] = {}

        def evaluate(model: nn.Module) -> float:
            self._count(stop)
            if "x" not in kept:
                kept["x"] = torch.randn_like(TASK.example_inputs()[0])
            model(kept["x"])
            return TASK.evaluate(model)
        return evaluate

    def _noisy(self, stop: int | None) -> Callable[[nn.Module], float]:
        rng = random.Random(0)

        def evaluate(model: nn.Module) -> float:
            self._count(stop)
            return TASK.evaluate(model) + rng.uniform(-1e-3, 1e-3)
        return evaluate


def run(evaluate: Counted, journal: Path, *, resume: bool = False,
        on_event: Callable[[TuneEvent], None] | None = None) -> TuneResult:
    torch.manual_seed(PROCESS_SEED)
    process = next(PROCESSES)
    random.seed(process)
    np.random.seed(process)
    return tune(TASK.build, evaluate.run, TASK.example_inputs, OPTIONS, on_event=on_event,
                journal=Journal(journal, FINGERPRINT, resume=resume))


@functools.cache
def uninterrupted(kind: str, folder: str) -> tuple[int, list[tuple[str, float | None, bool]]]:
    evaluate = Counted(kind)
    result = run(evaluate, Path(folder) / f"{kind}.jsonl")
    assert result.stopped is None and result.evals == evaluate.calls
    return evaluate.calls, [(t.label, t.metric, t.passed) for t in result.trials]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("uninterrupted"))


def journaled(journal: Path) -> int:
    return sum(json.loads(line).get("kind") == "eval" for line in journal.read_text().splitlines())


def assert_replayed(kind: str, folder: str, journal: Path, k: int) -> None:
    """`--resume` of `journal` (k evaluations in it) makes the n - k left, and the uninterrupted run's trials."""
    n, trials = uninterrupted(kind, folder)
    assert journaled(journal) == k
    evaluate = Counted(kind)
    resumed = run(evaluate, journal, resume=True)
    assert evaluate.calls == n - k, [t.label for t in resumed.trials]
    assert [t.from_journal for t in resumed.trials] == [True] * k + [False] * (n - k)
    assert [(t.label, t.metric, t.passed) for t in resumed.trials] == trials
    assert resumed.status == "ok" and {i.label() for i in resumed.plan.fp32_instances} <= TASK.build().fragile_labels()


# reseeds, k=1: the baseline from the journal left torch's generator where a new process has it, so the all-low
# trial looked noisy and the baseline was evaluated again (n - k + 1). noisy: every evaluation after the
# journaled ones drew other numbers than it drew in the interrupted run. k=2..5 of noisy: inside the baseline.
@pytest.mark.parametrize("kind,k", [("reseeds", 1), ("noisy", 1), ("noisy", 2), ("noisy", 4), ("noisy", -1)])
def test_interrupted_at_evaluation_k_of_n_resume_makes_n_minus_k(tmp_path, folder, kind, k):
    n, _ = uninterrupted(kind, folder)
    k = k % n
    journal = tmp_path / "journal.jsonl"
    interrupted = run(Counted(kind, stop=k), journal)
    assert interrupted.stopped is StopReason.INTERRUPTED and interrupted.evals == k
    assert_replayed(kind, folder, journal, k)


def test_interrupted_while_ranking_resume_makes_the_evaluations_left(tmp_path, folder):
    """Ctrl-C while the ranking runs (after the baseline's 5 runs and the all-low trial)."""
    def ctrl_c(event: TuneEvent) -> None:
        if event.kind is EventKind.RANK:
            raise KeyboardInterrupt

    journal = tmp_path / "journal.jsonl"
    interrupted = run(Counted("noisy"), journal, on_event=ctrl_c)
    assert interrupted.stopped is StopReason.INTERRUPTED and not interrupted.scores and interrupted.evals == 6
    assert_replayed("noisy", folder, journal, interrupted.evals)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_an_evaluate_that_keeps_what_its_first_call_drew_resumes_with_at_most_one_fp32_run_more(tmp_path, folder, k):
    """Issue 45: interrupted during the all-low trial (k=1), the resumed process's first call of such an evaluate
    draws other data than the journaled baseline's, so their signatures differ across processes. Its determinism
    is told from two runs this process made (the all-low trial and a second FP32 run), not from the journal's run
    and one of them: one FP32 run more, not two (8 evaluate calls in all against 5, before). Interrupted later,
    nothing is repeated."""
    n, trials = uninterrupted("caches", folder)
    journal = tmp_path / "journal.jsonl"
    assert run(Counted("caches", stop=k), journal).evals == k
    evaluate = Counted("caches")
    resumed = run(evaluate, journal, resume=True)
    extra = [t for t in resumed.trials if t.label == "FP32 baseline run 2"]
    assert evaluate.calls == n - k + len(extra) and len(extra) == (k == 1)
    assert [(t.label, t.metric, t.passed) for t in resumed.trials if t not in extra] == trials

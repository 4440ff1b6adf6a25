"""A training tune (`for_training`, issue 41): every trial trains FP32 parameters and buffers with the plan's
compute, bit for bit as torch.autocast around the forward trains them; every trial starts from the same model
and the same random draws; no lowered checkpoint is written; fp16 trains with tuner.LossScaler, and a plan whose
fp16 ops overflow fails with the scaler's reason; --resume skips finished training trials."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import tuner
from tuner.options.tune import TuneOptions
from tuner.search.results import StopReason
from tuner.search.session import tune
from tuner.workspace.journal import Journal, RunFingerprint

STEPS = 12
SKIPPED = 8  # LossScaler's max_skipped here (24 by default): fewer training steps per trial
_G = torch.Generator().manual_seed(5)
X = torch.randn(192, 16, generator=_G)
Y = (X @ torch.randn(16, 4, generator=_G)).argmax(1)
TRAIN, TEST = slice(0, 128), slice(128, None)


def build() -> nn.Module:  # unseeded: the tune puts every generator back before each build
    return nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 4))


class Amplified(nn.Module):
    """Trained on inputs of about 1e5 (`Trainer(gain=1e5)`): past fp16's 65504, so the first layer must stay FP32;
    its example inputs are small, so only training shows it."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x) * 1e-5))


class Trainer:
    """The user's training loop as `evaluate`: SGD over shuffled batches (torch's generator), dropout, a NumPy
    and a Python draw; it records what each run saw. `around_forward`: what wraps the forward (nothing in a
    tune: the trial's plan is attached; torch.autocast for the reference run)."""

    def __init__(self, around_forward: Callable[[], Any] = contextlib.nullcontext, scaler: bool = False,
                 stop: int | None = None, gain: float = 1.0) -> None:
        self.around_forward, self.scaler, self.stop, self.gain = around_forward, scaler, stop, gain
        self.dtypes: set[torch.dtype] = set()
        self.starts: list[torch.Tensor] = []
        self.initial: list[dict[str, torch.Tensor]] = []
        self.final: list[dict[str, torch.Tensor]] = []

    def __call__(self, model: nn.Module) -> float:
        if self.stop is not None and len(self.starts) >= self.stop:
            raise KeyboardInterrupt
        self.starts.append(torch.get_rng_state())
        self.initial.append({k: v.clone() for k, v in model.state_dict().items()})
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=0.05 + 0.0 * np.random.rand() * random.random(), momentum=0.9)
        scaler = tuner.LossScaler("cpu", max_skipped=SKIPPED) if self.scaler else None
        for _ in range(STEPS):
            idx = torch.randperm(128)[:32]
            with self.around_forward():
                out = model(X[TRAIN][idx] * self.gain)
            loss = F.cross_entropy(out.float(), Y[TRAIN][idx])
            opt.zero_grad()
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            self.dtypes |= {t.dtype for t in model.state_dict().values()}
        self.final.append({k: v.clone() for k, v in model.state_dict().items()})
        model.eval()
        with torch.no_grad(), self.around_forward():
            return float((model(X[TEST] * self.gain).argmax(1) == Y[TEST]).float().mean())


def test_trials_train_fp32_weights_as_torch_autocast_around_the_forward_trains_them():
    trainer = Trainer()
    result = tune(build, trainer, (X[:8],), for_training=True, tolerance=0.2)
    assert result.plan.for_training and result.evals == len(trainer.starts) >= 2
    assert trainer.dtypes == {torch.float32, torch.int64}  # parameters and BatchNorm's buffers: FP32 throughout
    assert all(torch.equal(s, trainer.starts[0]) for s in trainer.starts)  # the same draws in every trial
    assert all(all(torch.equal(v, run[k]) for k, v in trainer.initial[0].items()) for run in trainer.initial)
    assert sum(t.baseline for t in result.trials) == 1  # deterministic: one FP32 run settles the baseline
    all_low = result.trials[1]
    assert all_low.fp32 == () and all_low.metric is not None
    reference = Trainer(lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    model = build()
    model.load_state_dict(trainer.initial[1])
    torch.set_rng_state(trainer.starts[1])
    assert reference(model) == all_low.metric
    assert all(torch.equal(v, reference.final[0][k]) for k, v in trainer.final[1].items())
    assert not all(torch.equal(v, trainer.final[0][k]) for k, v in trainer.final[1].items())  # bf16 did compute


def test_a_training_run_writes_no_lowered_checkpoint_and_loads_on_fp32_weights(tmp_path):
    out = tmp_path / "out"
    result = tuner.tune(build, Trainer(), (X[:8],), for_training=True, tolerance=0.2, out=out, progress=False)
    assert result.plan.for_training and not (out / "model.safetensors").exists()
    assert "for_training: true" in (out / "plan.yaml").read_text()
    assert "no lowered checkpoint" in (out / "report.md").read_text()
    model = build()
    loaded = tuner.load(model, out)
    assert loaded is model and tuner.attached(loaded) is not None
    assert all(p.dtype == torch.float32 for p in loaded.parameters())


FP16 = TuneOptions(for_training=True, dtype="fp16", tolerance=0.2)


def fp16_tune(trainer: Trainer, journal: Path | None = None, resume: bool = False) -> Any:
    torch.manual_seed(1234)  # each run as a new process starts
    return tune(Amplified, trainer, (X[:8],), FP16, journal=None if journal is None else
                Journal(journal, RunFingerprint(source="s", weights="w"), resume=resume))


@functools.cache
def uninterrupted() -> tuple[Any, Trainer]:
    trainer = Trainer(scaler=True, gain=1e5)
    return fp16_tune(trainer), trainer


def test_fp16_trains_with_the_loss_scaler_and_a_plan_that_overflows_fails_with_its_reason():
    result, trainer = uninterrupted()
    all_low = result.trials[1]
    assert all_low.metric is None and f"skipped {SKIPPED} optimizer steps in a row" in (all_low.error or "")
    assert result.status == "ok" and any(t.passed and not t.baseline for t in result.trials)
    assert "first:linear#0" in {i.label() for i in result.plan.fp32_instances}  # where fp16 overflows
    assert trainer.dtypes == {torch.float32}  # FP32 master weights: GradScaler unscales FP32 gradients


@pytest.mark.parametrize("k", [1, 3])  # 1: during the all-low trial, whose fp16 training fails (issue 45)
def test_a_resumed_training_tune_skips_the_finished_trials(tmp_path, k):
    whole, trainer = uninterrupted()
    n = len(trainer.starts)
    assert n > k
    journal = tmp_path / "journal.jsonl"
    assert fp16_tune(Trainer(scaler=True, gain=1e5, stop=k), journal).stopped is StopReason.INTERRUPTED
    resumed_trainer = Trainer(scaler=True, gain=1e5)
    resumed = fp16_tune(resumed_trainer, journal, resume=True)
    assert len(resumed_trainer.starts) == n - k
    assert [t.from_journal for t in resumed.trials] == [True] * k + [False] * (n - k)
    assert [(t.label, t.metric) for t in resumed.trials] == [(t.label, t.metric) for t in whole.trials]
    assert all(torch.equal(s, trainer.starts[0]) for s in resumed_trainer.starts)  # the baseline's draws, journaled


def test_a_training_tune_cut_short_keeps_the_plan_confirmed_so_far():
    trainer = Trainer(scaler=True, gain=1e5)
    result = tune(Amplified, trainer, (X[:8],), dataclasses.replace(FP16, max_evals=4))
    assert result.stopped is StopReason.MAX_EVALS and result.evals == len(trainer.starts) == 4
    assert result.status == "not_met" and result.plan.for_training  # no plan passed yet: every candidate FP32
    assert {i.label() for i in result.plan.fp32_instances} == {"first:linear#0", "second:linear#0", "(root):mul#0"}


def test_an_interrupt_while_a_trained_model_is_built_again_keeps_the_passed_plan(tmp_path):
    """Ctrl-C/SIGTERM during the rebuild that undoes a training trial (issue 45: right after a passed trial) leaves
    the keeper without a model; the outputs of the plan confirmed so far build it again: no internal error, the
    plan written as cut short."""
    trainer, interrupted = Trainer(scaler=True, gain=1e5), []

    def build_once_interrupted() -> nn.Module:
        if len(trainer.starts) == 7 and not interrupted:  # trial 6 passed; trial 7 trained, undone here
            interrupted.append(True)
            raise KeyboardInterrupt
        return Amplified()

    torch.manual_seed(1234)
    out = tmp_path / "out"
    result = tuner.tune(build_once_interrupted, trainer, (X[:8],), dataclasses.replace(FP16, thorough=True), out=out,
                        progress=False)
    assert interrupted and result.stopped is StopReason.INTERRUPTED and result.status == "ok" and result.chosen == 6
    assert "for_training: true" in (out / "plan.yaml").read_text() and "stopped: interrupted" in \
        (out / "plan.yaml").read_text()

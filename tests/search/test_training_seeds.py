"""--seeds N (issue 45): a training tune trains each trial N times, run k from seed k's own generator states (the
same in every trial, so trials still differ only in precision), judges the mean against the target with the FP32
baseline's runs' spread as the noise margin, journals each run (resume repeats none), and says when a plan's
verdict depends on the seed."""
from __future__ import annotations

import json
from typing import Any

import torch

from tests.search.test_training_mode import X, Trainer, build
from tuner.search.noise import Acceptance
from tuner.search.results import Trial
from tuner.search.session import _seed_verdicts, tune
from tuner.workspace.journal import Journal, RunFingerprint

SEEDS = 3


def test_each_trial_trains_once_per_seed_and_is_judged_on_the_mean(tmp_path):
    trainer = Trainer()
    journal = tmp_path / "journal.jsonl"
    result = tune(build, trainer, (X[:8],), for_training=True, seeds=SEEDS, tolerance=0.3,
                  journal=Journal(journal, RunFingerprint(source="s", weights="w"), resume=False))
    assert len(trainer.starts) == SEEDS * result.evals
    runs = [trainer.starts[i:i + SEEDS] for i in range(0, len(trainer.starts), SEEDS)]
    assert all(all(torch.equal(a, b) for a, b in zip(run, runs[0], strict=True)) for run in runs)  # seed k alike
    assert not torch.equal(runs[0][0], runs[0][1]) and not torch.equal(runs[0][1], runs[0][2])  # seeds differ
    for t in result.trials:
        assert len(t.seeds) == SEEDS and t.metric is not None
        assert abs(t.metric - sum(t.seeds) / SEEDS) < 1e-12  # type: ignore[arg-type]
    base = result.trials[0]
    assert result.noise == max(base.seeds) - min(base.seeds)  # type: ignore[type-var, operator]
    keys = [json.loads(line)["key"] for line in journal.read_text().splitlines()[1:]]
    assert keys[:SEEDS] == ["baseline#1", "baseline#1@seed1", "baseline#1@seed2"] and len(keys) == len(set(keys))

    again = Trainer()
    resumed = tune(build, again, (X[:8],), for_training=True, seeds=SEEDS, tolerance=0.3,
                   journal=Journal(journal, RunFingerprint(source="s", weights="w"), resume=True))
    assert not again.starts and [t.metric for t in resumed.trials] == [t.metric for t in result.trials]


def test_a_verdict_that_depends_on_the_seed_is_told():
    accept = Acceptance(target=0.9, margin=0.01)
    split = Trial(4, "+1 FP32: fc2", ("fc2",), 0.905, False, 1.0, None, seeds=(0.93, 0.88, 0.905))  # type: ignore[arg-type]
    assert _seed_verdicts(split, accept) == "seed(s) 0, 2 pass and seed(s) 1 fail (metrics 0.93, 0.88, 0.905; mean 0.905)"
    agree = Trial(5, "x", (), 0.95, True, 1.0, None, seeds=(0.95, 0.94, 0.96))  # type: ignore[arg-type]
    assert _seed_verdicts(agree, accept) is None


def test_interrupted_inside_a_trials_training_runs_resume_makes_only_the_runs_left(tmp_path):
    """Interrupted during the all-low trial's second training run (3 runs journaled: the baseline's 2 and the
    trial's first), --resume makes the one run left and no FP32 run more (issue 45 item 5)."""
    def run(trainer: Trainer, resume: bool = False) -> Any:
        torch.manual_seed(1234)  # each run as a new process starts
        return tune(build, trainer, (X[:8],), for_training=True, seeds=2, tolerance=0.3,
                    journal=Journal(tmp_path / "j.jsonl", RunFingerprint("s", "w"), resume=resume))

    whole_trainer = Trainer()
    torch.manual_seed(1234)
    whole = tune(build, whole_trainer, (X[:8],), for_training=True, seeds=2, tolerance=0.3)
    assert len(whole_trainer.starts) == 4  # the baseline's 2 runs and the all-low trial's 2 (it passes)
    run(Trainer(stop=3))
    resumed_trainer = Trainer()
    resumed = run(resumed_trainer, resume=True)
    assert len(resumed_trainer.starts) == 1
    assert [(t.label, t.metric, t.seeds) for t in resumed.trials] == [(t.label, t.metric, t.seeds) for t in whole.trials]

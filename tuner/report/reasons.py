"""Why each op instance of the chosen plan stays FP32, and the run's facts a report opens with (model, date, time).

A reason is read off the trials, never guessed: the failed trial that ran the instance in the lower
precision with the fewest other differences from the plan. When that trial differs from the plan only
by this instance it proves the instance needed (`proved`); otherwise it is the closest evidence there is
(the search may have confirmed the plan without lowering each instance alone: `mpt tune --thorough` does).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tuner.core.hf_config import HF_PREFIX
from tuner.report.outcome import TuneReport
from tuner.search.results import Trial, TuneResult


@dataclass(frozen=True)
class Fp32Reason:
    """One FP32 instance of the plan: the trial that failed with it lowered (None: none did), how many other
    instances that trial changed besides it, its ranking score (None: not ranked) and its share of the FLOPs."""

    label: str
    trial: Trial | None
    others: int
    score: float | None
    flop_share: float | None

    @property
    def proved(self) -> bool:
        return self.trial is not None and self.others == 0

    def score_text(self) -> str:
        return "-" if self.score is None else f"{self.score:.3g}"

    def flop_text(self) -> str:
        """`2.9%`; `<0.1%` for an op with FLOPs too few to show; `0%` for none (an elementwise op)."""
        if self.flop_share is None:
            return "-"
        if 0 < self.flop_share < 0.0005:
            return "<0.1%"
        return f"{self.flop_share:.1%}" if self.flop_share else "0%"

    def text(self, dtype: str) -> str:
        """`trial 7 failed with it in bf16 (only change)` / `... (and 3 other changes)` / `no trial lowered it`."""
        if self.trial is None:
            return f"no trial ran it in {dtype} alone (kept FP32 with its module)"
        also = "only change from the plan" if self.others == 0 else \
            f"with {self.others} other difference{'s' if self.others > 1 else ''} from the plan"
        return f"trial {self.trial.n} failed with it in {dtype} ({also})"


def fp32_reasons(result: TuneResult, trials: tuple[Trial, ...] | list[Trial]) -> list[Fp32Reason]:
    """A reason for each FP32 instance of the result's plan, in the plan's order."""
    plan = {i.label() for i in result.plan.fp32_instances}
    failed = [t for t in trials if not t.baseline and not t.passed]
    reasons = []
    for label in sorted(plan):
        lowered = [t for t in failed if label not in t.fp32]
        best = min(lowered, key=lambda t: (len(plan.symmetric_difference(t.fp32)), -t.n), default=None)
        others = len(plan.symmetric_difference(best.fp32)) - 1 if best is not None else 0
        reasons.append(Fp32Reason(label, best, others, result.scores.get(label),
                                  result.flop_shares.get(label)))
    return reasons


@dataclass(frozen=True)
class RunFacts:
    """What a report states first: the model, when, how long and how many evaluations."""

    model: str
    created: str
    seconds: float
    evaluations: int

    def time_text(self) -> str:
        return f"{self.seconds:.1f} s" if self.seconds < 120 else f"{self.seconds / 60:.1f} min"


def run_facts(result: TuneResult, report: TuneReport, out: Path | None = None) -> RunFacts:
    """The model's file (and build function when named) or hf: folder, the report's date, the whole run's time.
    `out`: the output folder the plan's paths are relative to (an hf: folder is named by where it lies)."""
    ref = report.plan.model
    model = "(model object)" if ref is None else \
        _model_name(ref.file, out) + (f":{ref.build}" if ref.build else "")
    created = report.created.replace("T", " ")[:19] + (" UTC" if report.created else "")
    return RunFacts(model, created or "unknown", result.seconds + report.seconds, result.evals)


def _model_name(file: str, out: Path | None) -> str:
    """A model file's name; an hf: folder's last two names (`hf:all-MiniLM-L6-v2/model`): a saved folder is
    often called `model` or `final`, which alone says nothing of what was tuned."""
    if not file.startswith(HF_PREFIX):
        return Path(file).name
    folder = Path(file[len(HF_PREFIX):])
    if out is not None and not folder.is_absolute():
        folder = Path(os.path.abspath(out / folder))
    return HF_PREFIX + "/".join(p for p in Path(os.path.normpath(folder)).parts[-2:] if p not in ("..", ".", "/"))

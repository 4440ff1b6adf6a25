"""Why each op instance of the chosen plan stays FP32, and the run's facts a report opens with (model, date, time).

A reason is read off the trials, never guessed. The search decides per unit (the ops one module calls,
`tuner.search.candidates.Candidates.units`) and keeps FP32 a prefix of the ranking, so most instances never
get a trial of their own: blaming the all-low trial for each of them (it failed with every one lowered) says
nothing. A reason therefore names the failed trial that *isolated* the instance (its only difference from the
chosen plan is this instance, or this instance's module) where there is one (`proved`), and otherwise says so
plainly, first: no trial tested it in the lower dtype alone; kept with N others when trial K failed with them
all lowered (`mpt tune --thorough` tries each unit alone).
"""
from __future__ import annotations

import enum
import math
import os
from dataclasses import dataclass
from pathlib import Path

from tuner.core.hf_config import HF_PREFIX
from tuner.report.outcome import TuneReport
from tuner.search.results import Trial, TuneResult


class ReasonKind(str, enum.Enum):
    """What kept an FP32 instance so: a failed trial, the range rule (before any evaluation), or only the
    search's order (no failed trial ran it lowered)."""

    TRIAL = "trial"
    RANGE = "range"
    ORDER = "order"


@dataclass(frozen=True)
class Fp32Reason:
    """One FP32 instance of the plan: the failed trial closest to isolating it (None: no failed trial ran it
    lowered), how many other FP32 instances of the plan that trial lowered with it (`others`), how many
    instances it kept FP32 that the plan lowers (`extra`), whether those others are exactly the rest of its
    module (`module`: the search tries a module's ops together), its ranking score (None: not ranked) and
    its share of the FLOPs."""

    label: str
    trial: Trial | None
    others: int
    score: float | None
    flop_share: float | None
    extra: int = 0
    module: bool = False
    range_text: str = ""  # the range rule's reason (`tuner.measure.ranges.RangeReason.text`): kept before the search
    estimated: bool = False  # the score is the ranking's first-order estimate, not measured with it alone

    @property
    def kind(self) -> ReasonKind:
        if self.range_text:
            return ReasonKind.RANGE
        return ReasonKind.ORDER if self.trial is None else ReasonKind.TRIAL

    def __post_init__(self) -> None:
        if self.others < 0 or self.extra < 0:
            raise ValueError(f"others and extra must be >= 0, found {self.others} and {self.extra}")
        if self.trial is None and (self.others or self.extra or self.module):
            raise ValueError("a reason with no trial has no others, extra or module")

    @property
    def proved(self) -> bool:
        """A failed trial differs from the plan by this instance alone (or its module's instances alone)."""
        return self.trial is not None and self.extra == 0 and (self.others == 0 or self.module)

    def score_text(self) -> str:
        """The ranking's score with its unit: a relative change of the output, in percent (`51.4%`); `-`: not
        ranked (`score_header` and `score_note` say what it measures)."""
        if self.score is None:
            return "-"
        if math.isinf(self.score) or math.isnan(self.score):
            return "inf (overflow)" if self.score > 0 else "nan"
        return f"{100 * self.score:.3g}%" + (" (first-order estimate)" if self.estimated else "")

    def flop_text(self) -> str:
        """`2.9%`; `<0.1%` for an op with FLOPs too few to show; `0%` for none (an elementwise op)."""
        if self.flop_share is None:
            return "-"
        if 0 < self.flop_share < 0.0005:
            return "<0.1%"
        return f"{self.flop_share:.1%}" if self.flop_share else "0%"

    def text(self, dtype: str) -> str:
        """`trial 7 failed with it in bf16 (only change from the plan)`, or with its module's ops; else it says
        first that no trial tested it alone: `no trial tested it in bf16 alone; kept FP32 with 2 other
        instances when trial 2 failed with all 3 in bf16 ...`."""
        t = self.trial
        if self.range_text:
            return self.range_text + ("" if t is None else f"; {self._trial_text(dtype)}")
        if t is None:
            return f"no failed trial ran it in {dtype}: kept FP32 by the search's order, not by a trial"
        return self._trial_text(dtype)

    def _trial_text(self, dtype: str) -> str:
        t = self.trial
        assert t is not None
        if self.proved and not self.others:
            return f"trial {t.n} failed with it in {dtype} (only change from the plan)"
        if self.proved:
            return (f"trial {t.n} failed with its module's {self.others + 1} instances in {dtype} (only change "
                    "from the plan; a module's ops are tried together)")
        everything = " (every candidate lowered)" if not t.fp32 else ""
        also = f", and kept {self.extra} in FP32 that the plan lowers" if self.extra else ""
        if not self.others:  # the plan's other FP32 ops stayed FP32, and more: lowering it from the plan fails too
            return (f"trial {t.n} failed with it in {dtype}, the plan's other FP32 instances FP32 and {self.extra} "
                    "more (no trial lowered it from the plan itself)")
        return (f"no trial tested it in {dtype} alone; kept FP32 with {self.others} other "
                f"instance{'s' if self.others > 1 else ''} when trial {t.n} failed with all {self.others + 1} in "
                f"{dtype}{everything}{also}")


def score_header(dtype: str) -> str:
    """The heading of the score column: what the number is, not `score`."""
    return f"output error, alone in {dtype}"


def score_note(dtype: str) -> str:
    """What the score column measures, said once under the table."""
    return (f"{score_header(dtype)}: how much the model's output on the example inputs changes "
            f"(‖Δoutput‖ / ‖output‖, in percent) with only that op instance in {dtype}, its inputs as it receives "
            "them with the rest FP32; measured with one forward, or marked as the ranking's first-order estimate "
            "where it was not; inf: it overflows alone.")


def fp32_reasons(result: TuneResult, trials: tuple[Trial, ...] | list[Trial]) -> list[Fp32Reason]:
    """A reason for each FP32 instance of the result's plan, in the plan's order.

    Trials are compared with the chosen trial's FP32 set (the plan's, where none was chosen): the plan drops
    the overrides that change nothing, and a trial that lowered one of those changed nothing by it."""
    modules = {i.label(): i.module for i in result.plan.fp32_instances}
    plan = frozenset(modules)
    chosen = next((t for t in trials if t.n == result.chosen and not t.baseline), None)
    ref = plan | frozenset(chosen.fp32) if chosen is not None else plan
    failed = [t for t in trials if not t.baseline and not t.passed]
    reasons = []
    for label in sorted(plan):
        unit = frozenset(k for k, m in modules.items() if m == modules[label])
        best = min((t for t in failed if label not in t.fp32), default=None,
                   key=lambda t: _distance(t, label, unit, ref, plan))
        score, flops = result.scores.get(label), result.flop_shares.get(label)
        seen = {"range_text": result.range_kept.get(label, ""), "estimated": label in result.estimated}
        if best is None:
            reasons.append(Fp32Reason(label, None, 0, score, flops, **seen))  # type: ignore[arg-type]
            continue
        lowered = (ref - set(best.fp32)) & plan
        reasons.append(Fp32Reason(label, best, len(lowered) - 1, score, flops, extra=len(set(best.fp32) - ref),
                                  module=len(unit) > 1 and lowered == unit, **seen))  # type: ignore[arg-type]
    return reasons


def _distance(t: Trial, label: str, unit: frozenset[str], ref: frozenset[str], plan: frozenset[str]
              ) -> tuple[bool, int, int]:
    """How far failed trial `t` is from isolating `label`: a trial that lowered only it (or only its module's
    instances) first, then by how many instances it changed from `ref`, the latest trial first."""
    lowered, extra = (ref - set(t.fp32)) & plan, set(t.fp32) - ref
    isolated = not extra and lowered in ({label}, unit)
    return not isolated, len(lowered) + len(extra), -t.n


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
    model = "(model object)" if ref is None or ref.file is None else \
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


def fallback_reasons(result: TuneResult, report: TuneReport) -> list[tuple[str, str]]:
    """(label, why) for each op instance a fallback chain runs in its other 16-bit dtype: the range rule's
    reason (the lower dtype's range does not hold their values; the fallback's does), else the search's
    (their unit failed in the lower dtype, and the chosen trial ran it in the fallback dtype). report.md and
    search.html say the same."""
    plan = report.plan
    chosen = f"trial {result.chosen}" if result.chosen else "no trial"
    found = []
    for inst in plan.fallback_instances:
        label = inst.label()
        why = result.range_kept.get(label)
        beside = sorted(k for k in result.range_kept if k.rsplit(":", 1)[0] == label.rsplit(":", 1)[0])
        text = (f"{why}; {plan.fallback}'s range holds it, so it runs there, confirmed by {chosen}" if why else
                f"its module's unit goes with the range rule's `{beside[0]}`; {chosen} confirmed it in "
                f"{plan.fallback}" if beside else
                f"its unit was kept out of {plan.dtype} by the search; {chosen} confirmed it in {plan.fallback}")
        found.append((label, text))
    return found


def fallback_lines(result: TuneResult, report: TuneReport) -> list[str]:
    """report.md's block on the op instances a fallback chain runs in its other 16-bit dtype, and why
    (`fallback_reasons`). No lines without such instances."""
    plan = report.plan
    if not plan.fallback_instances:
        return []
    lines = [f"<details><summary>{plan.fallback} op instances (the first fallback) and why</summary>", "",
             f"| op instance | why {plan.fallback}, not {plan.dtype} or FP32 |", "|---|---|"]
    lines += [f"| `{label}` | {text.replace('|', '/')} |" for label, text in fallback_reasons(result, report)]
    return [*lines, "", "</details>", ""]

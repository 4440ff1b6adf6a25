"""The one-sentence outcome of a tune, as fields: what search.html states and the CLI's summary is made of."""
from __future__ import annotations

from dataclasses import dataclass

from tuner.report.metric_text import fmt_metric, metric_digits
from tuner.report.outcome import TuneReport
from tuner.search.results import TuneResult, TuneStatus


@dataclass(frozen=True)
class Verdict:
    """`head` (target met or not, and the metrics) and `details` (share, FP32 instances, evaluations).

    `str(verdict)` is the sentence: the parts joined by "; ". The CLI shows
    the head as a panel's title line and each detail on a line of its own.
    """

    met: bool
    head: str
    details: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "details", tuple(self.details))
        if not self.head:
            raise ValueError("a verdict needs a head")

    def __str__(self) -> str:
        return "; ".join((self.head, *self.details))


def plan_share(report: TuneReport) -> str:
    """The plan's lower-precision share, as every summary writes it (tuner.measure.shares)."""
    return report.shares.text(report.plan.dtype)


def run_digits(result: TuneResult, report: TuneReport) -> int:
    """The significant digits every metric of this run is written with (tuner.report.metric_text)."""
    return metric_digits(result.baseline, result.target, [result.metric, *(t.metric for t in report.trials)])


def verdict(result: TuneResult, report: TuneReport) -> Verdict:
    """Met or not, baseline -> tuned vs target, the share, the FP32 instances, the evaluations."""
    met = result.status is TuneStatus.MET
    d = run_digits(result, report)
    base, target = fmt_metric(result.baseline, d), fmt_metric(result.target, d)
    if met:
        head = f"target met: baseline {base} -> tuned {fmt_metric(result.metric, d)} (target {target}), " \
               f"trial {result.chosen}"
        first: tuple[str, ...] = ()
    else:
        head = f"target not met: no plan reached {target} (baseline {base})"
        first = ("the plan is all FP32",)
    details = (*first, plan_share(report),
               f"{len(result.plan.fp32_instances)} of {len(result.candidates)} op instances in FP32"
               + (f", {len(result.plan.fallback_instances)} in {result.plan.fallback}" if result.plan.fallback else ""),
               f"{result.evals} evaluations")
    return Verdict(met=met, head=head, details=details)


def plan_header(result: TuneResult) -> str:
    """The status line plan.yaml carries as a comment: status, why it was cut short, the metrics, evaluations."""
    return (f"status {result.status.value}" + (f", cut short: {result.stopped.value}" if result.stopped else "") +
            f"; baseline {result.baseline:.6g}, tuned {result.metric}, {result.evals} evaluations")

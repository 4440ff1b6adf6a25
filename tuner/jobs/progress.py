"""What `tuner.tune(..., progress=True)` shows while it runs: a rich live line and one line per trial.

The library itself never prints (its progress is typed events, tuner.search.results); this renderer is the
one place outside the CLI that turns those events into text, for Python callers: rich draws it in a terminal
and in a Jupyter notebook alike (a live spinner that is replaced by each trial's line). `progress=False`
shows nothing.
"""
from __future__ import annotations

from typing import Any

from tuner.report.metric_text import MetricDigits, fmt_metric
from tuner.search.results import EventKind, Trial, TuneEvent, TuneResult, TuneStatus


class ProgressDisplay:
    """Subscribes to a tune's events (call it with each one); `close()` ends the live line."""

    def __init__(self, console: Any = None) -> None:
        from rich.console import Console

        self.console = console or Console(highlight=False, soft_wrap=True)
        self.digits = MetricDigits()
        self._status: Any = None
        # rich draws a live line in a notebook only through ipywidgets (else it warns on every start)
        self._live = self.console.is_terminal or (self.console.is_jupyter and _has_ipywidgets())

    def _show(self, message: str) -> None:
        if not self._live:
            return  # piped, or a notebook without ipywidgets: the trial lines alone
        if self._status is None:
            self._status = self.console.status(message)
            self._status.start()
        else:
            self._status.update(message)

    def close(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def __call__(self, event: TuneEvent) -> None:
        data: Any = event.payload
        kind = event.kind
        if kind is EventKind.EVALUATING:
            self._show(f"eval {data.n}: evaluating {data.label} ...")
        elif kind is EventKind.RANK:
            self._show(f"ranking op instances {data.done}/{data.total} ({data.method.value})")
        elif kind is EventKind.BASELINE:
            d = self.digits.set_reference(data.value, data.target)  # the digits the trial lines use
            self.console.print(f"baseline {fmt_metric(data.value, d)}; target "
                               f"{'<=' if data.lower_is_better else '>='} {fmt_metric(data.target, d)}", markup=False)
        elif kind is EventKind.CANDIDATES:
            self.console.print(f"{data.count} op instances to decide ({data.dtype}, {data.preset})", markup=False)
            self._show("evaluating ...")
        elif kind is EventKind.TRIAL:
            self.console.print(self.trial_line(data), markup=False)
        elif kind is EventKind.DONE:
            self.close()

    def finish(self, result: TuneResult) -> None:
        """The closing line, as the CLI's: met or not, the metrics, the FP32 count, the evaluations."""
        self.close()
        d = self.digits.digits  # what the run needed to tell its metrics from the target
        met = "target met" if result.status is TuneStatus.MET else f"target not met ({result.status.value})"
        tuned = "none" if result.metric is None else fmt_metric(result.metric, d)
        chosen = f", trial {result.chosen}" if result.chosen else ""
        self.console.print(f"{met}: baseline {fmt_metric(result.baseline, d)} -> tuned {tuned} (target "
                           f"{fmt_metric(result.target, d)}){chosen}; {len(result.plan.fp32_instances)} of "
                           f"{len(result.candidates)} op instances in FP32"
                           + (f", {len(result.plan.fallback_instances)} in {result.plan.fallback}"
                              if result.plan.fallback else "") + f"; {result.evals} evaluations",
                           markup=False)

    def trial_line(self, t: Trial) -> str:
        """`eval   4  pass  0.9907  low 92% FLOPs  0.38s  +4 FP32: ...`, numbered as the CLI numbers them."""
        digits = self.digits.add(t.metric)
        verdict = "base" if t.baseline else "pass" if t.passed else "FAIL"
        metric = "error" if t.metric is None else fmt_metric(t.metric, digits)
        return (f"eval {t.n:>3}  {verdict:4}  {metric:>8}  low {t.shares.short()}  {t.seconds:6.2f}s  {t.label}"
                + (f" ({t.error})" if t.error else ""))


def _has_ipywidgets() -> bool:
    import importlib.util

    return importlib.util.find_spec("ipywidgets") is not None

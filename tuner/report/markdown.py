"""report.md: the outcome as a short Markdown table, what a CI job posts as a pull-request comment."""
from __future__ import annotations

from pathlib import Path

from tuner.report.metric_text import fmt_metric
from tuner.report.outcome import TuneReport
from tuner.report.verdict import plan_share, run_digits
from tuner.search.results import TuneResult, TuneStatus


def report_markdown(result: TuneResult, report: TuneReport, out: Path) -> str:
    """The text of report.md; `out` is the output folder the load snippet names."""
    dtype = report.plan.dtype
    fp32 = [i.label() for i in report.plan.fp32_instances]
    top = ", ".join(f"`{i}`" for i in fp32[:5]) + (f" and {len(fp32) - 5} more" if len(fp32) > 5 else "")
    d = run_digits(result, report)
    status = "✅ target met" if result.status is TuneStatus.MET else "❌ target not met"
    lines = [f"### mpt tune: {dtype} — {status}", "",
             "| | |", "|---|---|",
             f"| baseline → tuned | {fmt_metric(result.baseline, d)} → {fmt_metric(result.metric, d)} |",
             f"| target | {fmt_metric(result.target, d)} |",
             f"| in {dtype} | {plan_share(report)} |",
             f"| evaluations | {result.evals}" + (f" (chosen: trial {result.chosen})" if result.chosen else "") + " |",
             f"| FP32 op instances | {len(fp32)} of {len(result.candidates)}" + (f": {top}" if fp32 else "") + " |"]
    if report.latency is not None:
        lines.append(f"| forward | {report.latency.text()} |")
    if result.stopped:
        lines.append(f"| cut short | {result.stopped.value} |")
    lines += ["", *[f"> warning: {w}" for w in report.warnings], "",
              "Load the tuned model:", "", "```python", "import tuner",
              f'model = tuner.load(build_model(), "{out}")', "```", ""]
    return "\n".join(lines)

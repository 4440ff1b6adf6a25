"""report.md: the outcome as Markdown a CI job posts as a pull-request comment as it is: a title line naming the
model, the verdict in one line, a table with a real header, the FP32 instances and the trials folded away."""
from __future__ import annotations

import os
from pathlib import Path

from tuner.core.hf_config import HF_PREFIX, architecture, is_hf_spec
from tuner.report.metric_text import fmt_metric
from tuner.report.outcome import TuneReport
from tuner.report.reasons import fp32_reasons, run_facts
from tuner.report.verdict import plan_share, run_digits
from tuner.search.results import TuneResult, TuneStatus


def _cell(text: str) -> str:
    """Text for a table cell: `|` would end the cell and the `*` of compressed paths start emphasis."""
    return text.replace("|", "\\|").replace("*", "\\*")


def report_markdown(result: TuneResult, report: TuneReport, out: Path) -> str:
    """The text of report.md; `out` is the output folder the load snippet names."""
    dtype = report.plan.dtype
    facts = run_facts(result, report)
    d = run_digits(result, report)
    met = result.status is TuneStatus.MET
    status = "✅ target met" if met else "❌ target not met"
    n_fp32 = len(report.plan.fp32_instances)
    lines = [f"### mpt tune: `{facts.model}` in {dtype} — {status}", "",
             f"**{fmt_metric(result.baseline, d)} → {fmt_metric(result.metric, d)}** (target "
             f"{fmt_metric(result.target, d)}) · {n_fp32} of {len(result.candidates)} op instances in FP32 · "
             f"{result.evals} evaluations in {facts.time_text()}", "",
             "| result | value |", "|---|---|",
             f"| baseline → tuned | {fmt_metric(result.baseline, d)} → {fmt_metric(result.metric, d)} |",
             f"| target | {fmt_metric(result.target, d)} |",
             f"| in {dtype} | {plan_share(report)} |",
             f"| evaluations | {result.evals}" + (f" (chosen: trial {result.chosen})" if result.chosen else "") + " |",
             f"| FP32 op instances | {n_fp32} of {len(result.candidates)} |"]
    if report.latency is not None:
        lines.append(f"| forward | {report.latency.text()} |")
    if result.stopped:
        lines.append(f"| cut short | {result.stopped.value} |")
    lines.append(f"| run | {facts.created}, {facts.time_text()} |")
    lines += ["", *[f"> warning: {w}" for w in report.warnings], *([""] if report.warnings else []),
              *_details(result, report),
              "Load the tuned model:", "", "```python", *_load_snippet(report, out), "```", ""]
    return "\n".join(lines)


def _load_snippet(report: TuneReport, out: Path) -> list[str]:
    """Python that loads the tuned model: from its `hf:` folder with the class mpt loaded it with (its config's
    architecture), else from the model file's build_model()."""
    ref = report.plan.model
    if ref is not None and ref.file is not None and is_hf_spec(ref.file):
        folder = Path(os.path.normpath(out / ref.file[len(HF_PREFIX):]))
        arch = architecture(folder) if (folder / "config.json").is_file() else None
        if arch and not (folder / "modules.json").is_file():
            return ["import tuner", f"from transformers import {arch}", "",
                    f'model = tuner.load({arch}.from_pretrained("{folder}"), "{out}")']
    return ["import tuner", f'model = tuner.load(build_model(), "{out}")']


def _details(result: TuneResult, report: TuneReport) -> list[str]:
    """The FP32 instances with their reasons and the trials, each in a <details> block (folded on GitHub)."""
    dtype = report.plan.dtype
    lines: list[str] = []
    reasons = fp32_reasons(result, report.trials)
    if reasons:
        lines += ["<details><summary>FP32 op instances and why</summary>", "",
                  "| op instance | why FP32 | score | FLOP share |", "|---|---|---|---|"]
        lines += [f"| `{r.label}` | {_cell(r.text(dtype))} | {r.score_text()} | {r.flop_text()} |" for r in reasons]
        lines += ["", "</details>", ""]
    d = run_digits(result, report)
    lines += ["<details><summary>Trials</summary>", "", f"| # | what changed | metric | result | in {dtype} |",
              "|---|---|---|---|---|"]
    for t in report.trials:
        outcome = "baseline" if t.baseline else "pass" if t.passed else "fail"
        chosen = " **(chosen)**" if t.n == result.chosen else ""
        lines.append(f"| {t.n} | {_cell(t.label)}{chosen} | {fmt_metric(t.metric, d)} | {outcome} | "
                     f"{t.shares.short()} |")
    return [*lines, "", "</details>", ""]

"""report.md: the outcome as Markdown a CI job posts as a pull-request comment as it is: a title line naming the
model, the verdict in one line, a table with a real header, the FP32 instances and the trials folded away."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from tuner.core.hf_config import HF_PREFIX, architecture, is_hf_spec
from tuner.core.loader import DEFAULT_BUILD
from tuner.engine.scaler import ScalerSummary
from tuner.policy.plan import ModelRef
from tuner.report.metric_text import fmt_metric
from tuner.report.outcome import TuneReport
from tuner.report.reasons import fallback_lines, fp32_reasons, run_facts, score_header, score_note
from tuner.report.training_snippet import training_section
from tuner.report.verdict import plan_share, run_digits
from tuner.search.results import TuneResult, TuneStatus


def _cell(text: str) -> str:
    """Text for a table cell: `|` would end the cell and the `*` of compressed paths start emphasis."""
    return text.replace("|", "\\|").replace("*", "\\*")


def report_markdown(result: TuneResult, report: TuneReport, out: Path) -> str:
    """The text of report.md; `out` is the output folder the load snippet names."""
    dtype = report.plan.dtype
    chain = f"{dtype}, {report.plan.fallback} as first fallback" if report.plan.fallback else dtype
    facts = run_facts(result, report, out)
    d = run_digits(result, report)
    met = result.status is TuneStatus.MET
    status = "✅ target met" if met else "❌ target not met"
    n_fp32 = len(report.plan.fp32_instances)
    lines = [f"### mpt tune: `{facts.model}` in {chain} — {status}", "",
             f"**{fmt_metric(result.baseline, d)} → {fmt_metric(result.metric, d)}** (target "
             f"{fmt_metric(result.target, d)}) · {n_fp32} of {len(result.candidates)} op instances in FP32 · "
             f"{result.evals} evaluations in {facts.time_text()}", "",
             "| result | value |", "|---|---|",
             f"| baseline → tuned | {fmt_metric(result.baseline, d)} → {fmt_metric(result.metric, d)} |",
             f"| target | {fmt_metric(result.target, d)} |",
             f"| in {'16-bit' if report.plan.fallback else dtype} | {plan_share(report)} |",
             f"| evaluations | {result.evals}" + (f" (chosen: trial {result.chosen})" if result.chosen else "") + " |",
             f"| FP32 op instances | {n_fp32} of {len(result.candidates)} |",
             *([f"| {report.plan.fallback} op instances (fallback) | {len(report.plan.fallback_instances)} of "
                f"{len(result.candidates)} |"] if report.plan.fallback else []),
             *(f"| fallback chain | {_cell(n[len('fallback chain: '):])} |" for n in result.notes
               if n.startswith("fallback chain: "))]
    if report.latency is not None:
        lines.append(f"| forward | {report.latency.text()} |")
    if report.execution.fast_paths():  # the FP32 model may have timed faster on them: say why they are off
        lines.append(f"| torch fast paths | {_cell(report.execution.fast_paths())} |")
    if result.stopped:
        lines.append(f"| cut short | {result.stopped.value} |")
    if report.plan.for_training:
        lines.append(f"| training | every trial trained FP32 parameters and buffers with {dtype} compute (as "
                     "torch.autocast does); no lowered checkpoint is written: the FP32 weights are yours |")
    chosen = next((t for t in report.trials if t.n == result.chosen and t.scaler is not None), None)
    if chosen is not None and chosen.scaler is not None:
        lines.append(f"| loss scaler | trial {chosen.n}: {chosen.scaler.text()} (tuner.LossScaler, "
                     f"{chosen.scaler.device}) |")
    lines.append(f"| run | {facts.created}, {facts.time_text()} |")
    lines += ["", *[f"> warning: {w}" for w in report.warnings], *([""] if report.warnings else []),
              *_details(result, report),
              "Load the tuned model:", "", "```python", *_load_snippet(report, out), "```", "",
              *training_section(report.lists, out, device=report.device,
                                scaler=chosen.scaler if chosen is not None else _any_scaler(report))]
    return "\n".join(lines)


def _any_scaler(report: TuneReport) -> ScalerSummary | None:
    """What the first trial that made a tuner.LossScaler did (None: none made one): the plan trains with one."""
    return next((t.scaler for t in report.trials if t.scaler is not None), None)


def _load_snippet(report: TuneReport, out: Path) -> list[str]:
    """Python that loads the tuned model, as it runs from where mpt ran: an `hf:` run by its folder (built as
    the tune built it), with the class's own loader as the alternative; a model file's run from its
    build function, imported from the file (a sharded run's alike, under the same launcher)."""
    ref = report.plan.model
    if ref is None or ref.file is None:  # a model object, or tuner.tune from a notebook: no file to import
        return ["import tuner", "", f'model = tuner.load(build_model(), "{out}")']
    if is_hf_spec(ref.file):
        return _hf_snippet(Path(os.path.normpath(out / ref.file[len(HF_PREFIX):])), out)
    build_file, name = _build_function(ref, out)
    return ["import sys", "", "import tuner", "", *_import_lines(build_file, name), "",
            f'model = tuner.load({name}(), "{out}")']


def _hf_snippet(folder: Path, out: Path) -> list[str]:
    """`tuner.load("hf:DIR", OUT)`, then the same with the object the user would build themselves."""
    lines = ["import tuner", "", f'model = tuner.load("{HF_PREFIX}{folder}", "{out}")']
    if (folder / "modules.json").is_file():
        return [*lines, "# or your own object: SentenceTransformer(DIR) or AutoModel.from_pretrained(DIR):",
                "# from sentence_transformers import SentenceTransformer",
                f'# model = tuner.load(SentenceTransformer("{folder}"), "{out}")']
    arch = architecture(folder) if (folder / "config.json").is_file() else None
    if not arch:
        return lines
    return [*lines, "# or with the class's own loader:", f"# from transformers import {arch}",
            f'# model = tuner.load({arch}.from_pretrained("{folder}"), "{out}")']


def _build_function(ref: ModelRef, out: Path) -> tuple[Path, str]:
    """The file and name of the build function the plan records: `build: NAME`, `FILE.py` or `FILE.py:NAME`
    (files relative to the output folder), else the model file's build_model."""
    build = ref.build or ""
    head, sep, tail = build.rpartition(":")
    if sep and head.lower().endswith(".py"):
        return Path(os.path.normpath(out / head)), tail or DEFAULT_BUILD
    if build.lower().endswith(".py"):
        return Path(os.path.normpath(out / build)), DEFAULT_BUILD
    return Path(os.path.normpath(out / (ref.file or ""))), build or DEFAULT_BUILD


def _import_lines(file: Path, name: str) -> list[str]:
    """`name` from `file` with its folder first on sys.path (as mpt tune ran it); a file whose name is no
    module name (or a standard library one's) is run with runpy instead."""
    if file.stem.isidentifier() and file.stem not in sys.stdlib_module_names:
        return [f'sys.path.insert(0, "{file.parent}")', f"from {file.stem} import {name}"]
    return [f'sys.path.insert(0, "{file.parent}")', "import runpy",
            f'{name} = runpy.run_path("{file}")["{name}"]']


def _details(result: TuneResult, report: TuneReport) -> list[str]:
    """The FP32 instances with their reasons and the trials, each in a <details> block (folded on GitHub)."""
    dtype = report.plan.dtype
    lines: list[str] = []
    reasons = fp32_reasons(result, report.trials)
    if reasons:
        lines += ["<details><summary>FP32 op instances and why</summary>", "",
                  f"| op instance | why FP32 | {score_header(dtype)} | FLOP share |", "|---|---|---|---|"]
        lines += [f"| `{r.label}` | {_cell(r.text(dtype))} | {r.score_text()} | {r.flop_text()} |" for r in reasons]
        lines += ["", score_note(dtype), "", "</details>", ""]
    lines += fallback_lines(result, report)
    d = run_digits(result, report)
    low = "16-bit" if report.plan.fallback else dtype
    lines += ["<details><summary>Trials</summary>", "", f"| # | what changed | metric | result | in {low} |",
              "|---|---|---|---|---|"]
    for t in report.trials:
        outcome = "baseline" if t.baseline else "pass" if t.passed else "fail"
        if t.error and not t.passed:  # why: evaluate raised (tuner.LossScaler's StepsSkipped...), or no number
            outcome += f": {_cell(t.error)}"
        chosen = " **(chosen)**" if t.n == result.chosen else ""
        lines.append(f"| {t.n} | {_cell(t.label)}{chosen} | {fmt_metric(t.metric, d)} | {outcome} | "
                     f"{t.shares.short()} |")
    return [*lines, "", "</details>", ""]

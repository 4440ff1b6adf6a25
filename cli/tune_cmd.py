"""`mpt tune`: the accuracy-driven FP32-fallback search (thin wrapper over tuner.tune)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from tuner.core.launch_env import is_follower_by_env
from tuner.report.metric_text import MetricDigits, fmt_metric

from . import exitcodes
from .common import guarded, join_ranks
from .options import TUNE, command_options, options
from .render import console, err, hanging, is_tty, warn

EPILOG = """\b
Examples:
  mpt tune examples/digits_sensor.py --dtype bf16
  mpt tune model.py --tolerance 0.005 --max-evals 20 --out runs/bf16
  mpt tune model.py:make_net --eval score --lower-is-better --absolute --tolerance 0.1
  mpt tune hf:runs/tiny-bert --data runs/tiny-bert/calibration.safetensors
  mpt tune --config configs/digits_sensor.yaml
  mpt tune model.py --out runs/bf16 --resume     # continue an interrupted run
  torchrun --nproc-per-node 4 --no-python mpt tune model.py   # evaluate sharded over 4 processes

\b
Outputs in --out: plan.yaml, lower_precision_ops.txt, fp32_ops.txt,
model.safetensors, report.json, report.md, search.html, journal.jsonl.
Load the result with tuner.load(build_model(), "mpt-out"), an hf: run's with
tuner.load("hf:DIR", "mpt-out"); report.md prints the line for the run.
--save-pretrained SAVED (hf: runs) also writes a Hugging Face folder that
tuner.load("hf:SAVED") loads with its plan.
"""


class _Renderer:
    """One line per trial (the baseline's first run is trial 1); a spinner or progress bar while work runs on a
    terminal. Piped output is one plain line per event: lines starting with "eval N" are the trials."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.tty = is_tty()
        self.out = console()
        self.progress: Any = None
        self.task: Any = None
        self.status: Any = None
        self.digits = MetricDigits()  # one run's metrics are written with one number of digits
        self.target_digits = 0  # the digits the target was last shown with (0: not yet shown)
        self.held: list[str] = []  # run warnings waiting for the first evaluation to come back
        self.shown: set[str] = set()  # run warnings already printed (the summary does not repeat them)

    def working(self, message: str) -> None:
        """A spinner on a terminal (replaced by the next line), a plain line when piped."""
        if self.quiet:
            return
        if not self.tty:
            self.out.print(message, markup=False)
            return
        self.stop()
        self.status = self.out.status(message)
        self.status.start()

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
        if self.status is not None:
            self.status.stop()
            self.status = None

    def __call__(self, event: Any) -> None:
        if self.quiet:
            return
        from tuner.search.results import EventKind

        data = event.payload
        if event.kind is EventKind.BUILDING:  # the folder is claimed: no refusal that needs no model follows
            self.working("building the model and evaluating the FP32 baseline ...")
            return
        if event.kind is EventKind.EVALUATING:
            if self.tty:
                self.working(f"eval {data.n}: evaluating {data.label} ...")
            return
        if event.kind is EventKind.RANK:
            self.ranking(data)
            return
        if event.kind is EventKind.WARNING:
            self.held.append(data.text)
            return
        self.stop()
        self.flush_warnings()
        if event.kind is EventKind.BASELINE:
            self.target_digits = self.digits.set_reference(data.value, data.target)  # the trials' digits
            self.out.print(self.baseline_line(data, self.target_digits), markup=False)
            if self.tty and not data.noisy:  # a noisy baseline is told again after the all-low trial
                self.working("finding the op instances that run in lower precision ...")
        elif event.kind is EventKind.CANDIDATES:
            self.out.print(f"{data.count} op instances run in {data.dtype} under {data.preset} and change the "
                           f"numbers; all-{data.dtype} output error {data.all_low_error:.2e}", markup=False)
        elif event.kind is EventKind.TRIAL:
            self.trial(data)

    def flush_warnings(self) -> None:
        """The run's warnings, once the first evaluation came back: before the search (a slow dtype can be
        stopped at once), yet never above an error of evaluate's that they do not explain."""
        for text in self.held:
            warn(text)
            self.shown.add(text)
        self.held.clear()

    @staticmethod
    def baseline_line(b: Any, digits: int = 6) -> str:
        """`baseline 0.9521; target >= 0.9426`, with the noise margin when evaluate is not deterministic."""
        relation = "<=" if b.lower_is_better else ">="
        noise = f" (noise: FP32 runs spread over {b.spread:.3g}; a trial must clear the target by more)" \
            if b.noisy else ""  # the whole range (max - min), not a ± half-width
        return f"baseline {fmt_metric(b.value, digits)}{noise}; target {relation} {fmt_metric(b.target, digits)}"

    def ranking(self, progress: Any) -> None:
        """The method once when piped; a progress bar on a terminal."""
        from tuner.options.tune import RankMethod

        if not self.tty and progress.done == 1:
            how = ("one shadowed forward pass + backward probes" if progress.method is RankMethod.GRADIENT
                   else "one forward pass per op instance")
            self.out.print(f"ranking op instances on example inputs ({progress.method.value}: {how})", markup=False)
        if self.tty:
            if self.progress is None:
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

                self.stop()
                self.progress = Progress(TextColumn("ranking op instances"), BarColumn(), MofNCompleteColumn(),
                                         console=self.out, transient=True)
                self.progress.start()
                self.task = self.progress.add_task("rank", total=progress.total)
            self.progress.update(self.task, completed=progress.done)

    def trial(self, t: Any) -> None:
        digits = self.digits.add(t.metric)
        metric = "error" if t.metric is None and not t.baseline else fmt_metric(t.metric, digits)
        if self.target_digits and digits > self.target_digits:  # it takes more digits to tell from the target
            self.target_digits = digits
            metric += f" (target {fmt_metric(self.digits.target, digits)})"
        verdict = "base" if t.baseline else "pass" if t.passed else "FAIL"
        extra = f" ({t.error})" if t.error else ""
        cached = " [journal]" if t.from_journal else ""
        if self.tty:
            from rich.text import Text

            style = "dim" if t.baseline else "green" if t.passed else "red"
            head = Text.assemble((f"eval {t.n:>3}", "dim"), "  ", (f"{verdict:4}", style),
                                 f"  {metric:>8}  low {t.shares.short()}  {t.seconds:6.2f}s  ")
            self.out.print(hanging(self.out, head, Text(t.label + extra + cached)))
        else:
            self.out.print(f"eval {t.n:>3}  {verdict:4}  metric {metric:>8}  low {t.shares.short()}  "
                           f"{t.seconds:6.2f}s  {t.label}{extra}{cached}", markup=False)


@click.command(TUNE, epilog=EPILOG)
@options(TUNE)
@guarded
def tune_cmd(**values: Any) -> None:
    """Find which op instances must stay FP32 so the model keeps its accuracy in bf16/fp16.

    Evaluates the FP32 baseline, then everything eligible in the lower dtype;
    if that misses the target, ranks op instances on example inputs by their
    damage to the output
    and confirms the FP32 fallbacks with as few full evaluations as it can.
    Every reported plan was confirmed by a full evaluation.

    Under torchrun every rank runs this and rank 0 decides, reports and writes (README: torchrun).
    """
    started = time.monotonic()  # --time-budget counts from here
    opts = command_options(values)  # tuner.options.commands.TuneCommandOptions (checked; no torch yet)
    # within a second, before torch is imported; under torchrun only rank 0 (by its environment) reports
    render = _Renderer(opts.quiet or is_follower_by_env())
    render.working(f"loading {opts.model} ...")
    try:
        run, ranks = _tune(opts, render, started)
    finally:
        render.stop()
    code = _summarize(run, opts, opts.quiet, shown=render.shown) if ranks.is_main else None
    click.get_current_context().exit(ranks.finish(code))  # under torchrun every rank ends with rank 0's code


def _tune(opts: Any, render: _Renderer, started: float) -> tuple[Any, Any]:
    """Ranks -> the user's file -> the run; (TuneRun, Ranks). Imports torch."""
    from tuner.core.errors import Interrupted
    from tuner.core.output_files import JOURNAL_NAME
    from tuner.jobs.prepare import FIDELITY_KEYS, load_model
    from tuner.jobs.tune_run import tune_into_folder
    from tuner.workspace.journal import holds_trials

    ranks = join_ranks(click.get_current_context(), opts.device)  # before the user's code (torch.distributed on import)
    user = load_model(opts.model, specs=opts.specs(), fidelity={k: getattr(opts, k) for k in FIDELITY_KEYS},
                      device=opts.device, folder=Path(opts.out) if ranks.is_main else None)
    try:
        run = tune_into_folder(user, opts.tune_options(), opts.out, resume=opts.resume, overwrite=opts.overwrite,
                               specs=opts.specs(), on_event=render, started=started, latency=opts.latency,
                               ranks=ranks, consolidate=opts.consolidate, save_pretrained=opts.save_pretrained)
    except (KeyboardInterrupt, Interrupted):
        if ranks.is_main and not holds_trials(Path(opts.out) / JOURNAL_NAME):  # nothing finished: nothing kept
            raise Interrupted(f"interrupted before the first evaluation finished; nothing was kept in {opts.out} "
                              "(run the command again; there is nothing to resume)") from None
        raise
    return run, ranks


def _summarize(run: Any, options: Any, quiet: bool, shown: set[str] | frozenset[str] = frozenset()) -> int:
    """The verdict (a short panel on a terminal, plain lines when piped), notes and warnings (but those `shown`
    while it ran); the exit code."""
    from tuner.core.output_files import REPORT_MD_NAME, SEARCH_PAGE_NAME
    from tuner.report.verdict import verdict
    from tuner.search.results import StopReason

    result, out, report = run.result, run.out, run.report
    if result.stopped is StopReason.INTERRUPTED:
        wrote = (f"wrote the best plan confirmed so far to {out}/ (status: cut short)" if run.wrote_outputs
                 else "no plan was confirmed yet")
        err(f"interrupted; {wrote}; rerun with --resume to continue")
        return exitcodes.INTERRUPTED
    out_console = console()
    for note in result.notes:
        out_console.print(f"note: {note}", markup=False)
    if not quiet:  # after the run: a warning must never come before an error it does not explain
        for w in report.warnings:
            if w not in shown:
                warn(w)
    said = verdict(result, report)
    met, head, rest = said.met, said.head, list(said.details)
    if report.latency is not None:
        rest.append(f"forward {report.latency.text()}")
    if result.stopped:
        rest.append(f"search cut short ({result.stopped.describe(options)})" +
                    (": this is the best confirmed plan so far" if met else ""))
    rest.append(f"wrote {out}/" + ("" if met else " with the all-FP32 plan") +
                f" ({REPORT_MD_NAME}, {SEARCH_PAGE_NAME})")
    if run.saved is not None:
        rest.append(f'saved the tuned model to {run.saved}/: tuner.load("hf:{run.saved}") loads it with its plan')
    if is_tty() and not quiet:
        from rich.panel import Panel
        from rich.text import Text

        body = Text(head, style="bold green" if met else "bold red")
        for line in rest:
            body.append("\n" + line)
        out_console.print(Panel(body, title="mpt tune", expand=False, border_style="green" if met else "red"))
    else:
        last = -2 if run.saved is not None else -1  # the folders written, one line each
        out_console.print(head + "; " + "; ".join(rest[:last]), markup=False)
        for line in rest[last:]:
            out_console.print(line, markup=False)
    return exitcodes.OK if met else exitcodes.TARGET_NOT_MET

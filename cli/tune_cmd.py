"""`mpt tune`: the accuracy-driven FP32-fallback search (thin wrapper over tuner.tune)."""
from __future__ import annotations

import time
from typing import Any

import click

from . import exitcodes
from .common import guarded, join_ranks
from .options import TUNE, options
from .render import console, err, is_tty, warn

EPILOG = """\b
Examples:
  mpt tune examples/digits_sensor.py --dtype bf16
  mpt tune model.py --tolerance 0.005 --max-evals 20 --out runs/bf16
  mpt tune model.py:make_net --eval score --lower-is-better --absolute --tolerance 0.1
  mpt tune --config configs/digits_sensor.yaml
  mpt tune model.py --out runs/bf16 --resume     # continue an interrupted run
  torchrun --nproc-per-node 4 --no-python mpt tune model.py   # evaluate sharded over 4 processes

\b
Outputs in --out: plan.yaml, lower_precision_ops.txt, fp32_ops.txt,
model.safetensors, report.json, search.html, journal.jsonl.
Load the result with tuner.load(build_model(), "mpt-out").
"""


class _Renderer:
    """One row per trial: a rich live table on a terminal, one plain line each otherwise."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.tty = is_tty()
        self.out = console()
        self.progress: Any = None
        self.task: Any = None

    def __call__(self, event: Any) -> None:
        if self.quiet:
            return
        from tuner.tune import EventKind

        if event.kind is EventKind.RANK:
            if not self.tty and event.done == 1:
                how = ("one shadowed forward pass + backward probes" if event.message == "gradient"
                       else "one forward pass per op instance")
                self.out.print(f"ranking op instances on example inputs ({event.message}: {how})", markup=False)
            if self.tty:
                if self.progress is None:
                    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

                    self.progress = Progress(TextColumn("ranking op instances"), BarColumn(), MofNCompleteColumn(),
                                             console=self.out, transient=True)
                    self.progress.start()
                    self.task = self.progress.add_task("rank", total=event.total)
                self.progress.update(self.task, completed=event.done)
            return
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
        if event.kind in (EventKind.BASELINE, EventKind.CANDIDATES):
            self.out.print(event.message, markup=False)
        elif event.kind is EventKind.TRIAL:
            t = event.trial
            metric = "error" if t.metric is None else f"{t.metric:.6g}"
            verdict = "pass" if t.passed else "FAIL"
            extra = f" ({t.error})" if t.error else ""
            cached = " [journal]" if t.from_journal else ""
            if self.tty:
                style = "green" if t.passed else "red"
                from rich.markup import escape

                self.out.print(f"[dim]eval {event.done:>3}[/dim]  [{style}]{verdict:4}[/{style}]  {metric:>10}  "
                               f"low {t.low_share:4.0%}  {escape(t.label + extra + cached)}", markup=True)
            else:
                self.out.print(f"eval {event.done:>3}  {verdict:4}  metric {metric:>10}  low {t.low_share:4.0%}  "
                               f"{t.seconds:6.2f}s  {t.label}{extra}{cached}", markup=False)


@click.command(TUNE, epilog=EPILOG)
@options(TUNE)
@guarded
def tune_cmd(model_file: str | None, dtype: str, preset: str | None, tolerance: float, absolute: bool,
             lower_is_better: bool, max_evals: int | None, time_budget: float | None, out_dir: str, resume: bool,
             overwrite: bool, device: str, thorough: bool, latency: bool, rank: str, quiet: bool,
             config_path: str | None, model_fn: str | None, eval_fn: str | None, inputs_fn: str | None) -> None:
    """Find which op instances must stay FP32 so the model keeps its accuracy in bf16/fp16.

    Evaluates the FP32 baseline, then everything eligible in the lower dtype;
    if that misses the target, ranks op instances on example inputs by their
    damage to the output
    and confirms the FP32 fallbacks with as few full evaluations as it can.
    Every reported plan was confirmed by a full evaluation.

    Under torchrun every rank runs this and rank 0 decides, reports and writes (tuner.distributed).
    """
    from tuner.errors import ConfigError
    from tuner.loader import load_user_model
    from tuner.run import tune_into_folder
    from tuner.tune import TuneOptions

    started = time.monotonic()  # --time-budget counts from here
    if not model_file:
        raise ConfigError("missing MODEL.py: give it as the argument or as `model:` in --config")
    if resume and overwrite:
        raise ConfigError("give --resume or --overwrite, not both")
    options = TuneOptions(dtype=dtype, preset=preset, tolerance=tolerance, absolute=absolute,
                          lower_is_better=lower_is_better, max_evals=max_evals, time_budget=time_budget,
                          device=device, thorough=thorough, rank=rank)
    ctx = click.get_current_context()
    ranks = join_ranks(ctx, device)  # before the user's code, which may use torch.distributed on import
    user = load_user_model(model_file, model=model_fn, eval=eval_fn, inputs=inputs_fn)
    run = tune_into_folder(user, options, out_dir, resume=resume, overwrite=overwrite,
                           specs={"build": model_fn, "eval": eval_fn, "inputs": inputs_fn},
                           on_event=_Renderer(quiet), started=started, latency=latency, ranks=ranks)
    code = _summarize(run, options, quiet) if ranks.is_main else None
    ctx.exit(ranks.finish(code))  # under torchrun every rank ends with rank 0's exit code


def _summarize(run: Any, options: Any, quiet: bool) -> int:
    """The verdict line, notes and warnings; the exit code for the outcome."""
    from tuner.tune import StopReason, TuneStatus

    result, out = run.result, run.out
    if result.stopped is StopReason.INTERRUPTED:
        wrote = (f"wrote the best plan confirmed so far to {out}/ (status: cut short)" if run.wrote_outputs
                 else "no plan was confirmed yet")
        err(f"interrupted; {wrote}; rerun with --resume to continue")
        return exitcodes.INTERRUPTED
    out_console = console()
    for note in result.notes:
        out_console.print(f"note: {note}", markup=False)
    if not quiet:  # after the run: a warning must never come before an error it does not explain
        for w in run.report["warnings"]:
            warn(w)
    lat = run.report["latency_ms"]
    timing = f"forward {lat['tuned']:.2f} ms vs {lat['fp32']:.2f} ms FP32; " if lat else ""
    share = run.report["low_precision_flop_share"]
    cut = f"; search cut short ({result.stopped.describe(options)})" if result.stopped else ""
    if result.status is TuneStatus.MET:
        out_console.print(
            f"target met: {result.metric:.6g} vs baseline {result.baseline:.6g} (target {result.target:.6g}); "
            f"{len(result.plan.fp32_instances)} of {len(result.candidates)} op instances in FP32; "
            f"{share:.0%} of matmul/conv FLOPs in {options.dtype}; {result.evals} evaluations; "
            f"{timing}wrote {out}/", markup=False)
        if result.stopped:
            out_console.print(f"search cut short ({result.stopped.describe(options)}): this is the best "
                              "confirmed plan so far", markup=False)
        return exitcodes.OK
    out_console.print(f"target not met: no plan reached {result.target:.6g} (baseline {result.baseline:.6g}) in "
                      f"{result.evals} evaluations{cut}; wrote {out}/ with the all-FP32 plan", markup=False)
    return exitcodes.TARGET_NOT_MET

"""`mpt tune`: the accuracy-driven FP32-fallback search (thin wrapper over tuner.tune)."""
from __future__ import annotations

import sys
from typing import Any

import click

from . import exitcodes
from .common import config_option, dtype_option, guarded, plan_header_spec, user_code_options
from .render import console, is_tty, warn

EPILOG = """\b
Examples:
  mpt tune examples/digits_sensor.py --dtype bf16
  mpt tune model.py --tolerance 0.005 --max-evals 20 --out runs/bf16
  mpt tune model.py:make_net --eval score --lower-is-better --absolute --tolerance 0.1
  mpt tune --config configs/digits_sensor.yaml
  mpt tune model.py --out runs/bf16 --resume     # continue an interrupted run

\b
Outputs in --out: plan.yaml, lower_precision_ops.txt, fp32_ops.txt,
model.safetensors, report.json, search.html, journal.jsonl.
Load the result with tuner.load(build_model(), "mpt-out").
"""


# Config keys whose parameter has another name here (tuner.config.KEYS lists the keys).
CONFIG_PARAMS = {"model": "model_file", "out": "out_dir", "eval": "eval_fn", "inputs": "inputs_fn"}


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
        if event.kind == "rank":
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
        if event.kind in ("baseline", "candidates"):
            self.out.print(event.message, markup=False)
        elif event.kind == "trial":
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


@click.command("tune", epilog=EPILOG)
@click.argument("model_file", metavar="MODEL.py[:build_fn]", required=False)
@dtype_option(default="bf16")
@click.option("--preset", default=None, metavar="NAME",
              help="Op-list preset to start from. Default: torch-cpu on --device cpu (torch.autocast's CPU "
                   "list: matmuls/convs in the lower dtype, where AVX512-BF16/AMX give the speed; other ops "
                   "follow their inputs), torch-cuda on cuda.")
@click.option("--tolerance", type=float, default=0.01, show_default=True,
              help="Allowed loss against the FP32 baseline: relative (0.01 = 1%) unless --absolute.")
@click.option("--absolute", is_flag=True, help="Treat --tolerance as an absolute drop of the metric.")
@click.option("--lower-is-better", is_flag=True, help="The metric is a loss/perplexity: lower is better.")
@click.option("--max-evals", type=int, default=None, metavar="N", help="Stop after N full evaluations (baseline included).")
@click.option("--time-budget", type=float, default=None, metavar="SECONDS", help="Stop starting trials after this long.")
@click.option("--out", "out_dir", default="mpt-out", show_default=True, metavar="DIR", help="Output folder.")
@click.option("--resume", is_flag=True, help="Continue the run in --out; finished evaluations are not repeated.")
@click.option("--overwrite", is_flag=True, help="Replace a previous run in --out.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--thorough", is_flag=True, help="Prove every FP32 instance necessary (more evaluations).")
@click.option("--rank", type=click.Choice(["gradient", "exact"]), default="gradient", show_default=True,
              help="How to rank op instances before the search: gradient = one forward with every op's "
                   "low-precision error plus a few backward passes (first-order damage to the output); "
                   "exact = one forward per op instance (slower; catches saturation effects).")
@click.option("--quiet", "-q", is_flag=True, help="Only the final verdict.")
@config_option("tune", CONFIG_PARAMS)
@user_code_options
@guarded
def tune_cmd(model_file: str | None, dtype: str, preset: str | None, tolerance: float, absolute: bool,
             lower_is_better: bool, max_evals: int | None, time_budget: float | None, out_dir: str, resume: bool,
             overwrite: bool, device: str, thorough: bool, rank: str, quiet: bool, config_path: str | None,
             model_fn: str | None, eval_fn: str | None, inputs_fn: str | None) -> None:
    """Find which op instances must stay FP32 so the model keeps its accuracy in bf16/fp16.

    Evaluates the FP32 baseline, then everything eligible in the lower dtype;
    if that misses the target, ranks op instances on example inputs by their
    damage to the output
    and confirms the FP32 fallbacks with as few full evaluations as it can.
    Every reported plan was confirmed by a full evaluation.
    """
    from tuner.errors import ConfigError
    from tuner.journal import JOURNAL_NAME, Journal
    from tuner.loader import load_user_model
    from tuner.outputs import prepare_out_dir, write_outputs
    from tuner.tune import TuneOptions, tune
    from tuner.devices import check_device

    ctx = click.get_current_context()
    if not model_file:
        raise ConfigError("missing MODEL.py: give it as the argument or as `model:` in --config")
    if resume and overwrite:
        raise ConfigError("give --resume or --overwrite, not both")
    options = TuneOptions(dtype=dtype, preset=preset, tolerance=tolerance, absolute=absolute,
                          lower_is_better=lower_is_better, max_evals=max_evals, time_budget=time_budget,
                          device=device, thorough=thorough, rank=rank)
    user = load_user_model(model_file, model=model_fn, eval=eval_fn, inputs=inputs_fn)
    speed_warning = check_device(device, options.dtype)
    out = prepare_out_dir(out_dir, resume=resume, overwrite=overwrite)
    header = {"model": str(user.path.name), "dtype": options.dtype, "preset": options.preset,
              "tolerance": options.tolerance, "absolute": options.absolute,
              "lower_is_better": options.lower_is_better, "device": device}
    journal = Journal(out / JOURNAL_NAME, header, resume=resume)
    renderer = _Renderer(quiet)
    inputs = user.example_inputs if user.inputs_fn is not None else None
    result = tune(user.build, user.evaluate, inputs, options, journal=journal, on_event=renderer)
    if speed_warning:
        result.warnings.append(speed_warning)
    # plan.yaml's header records the model file (relative to --out) and function names for `mpt check`.
    header_spec = plan_header_spec(user, out, model_fn=model_fn, eval_fn=eval_fn, inputs_fn=inputs_fn)
    report = write_outputs(result, user.build, out, device=device, model_file=header_spec)
    out_console = console()
    for note in result.notes:
        out_console.print(f"note: {note}", markup=False)
    if not quiet:  # after the run: a warning must never come before an error it does not explain
        for w in report["warnings"]:
            warn(w)
    lat = report["latency_ms"]
    share = report["low_precision_flop_share"]
    if result.status == "ok":
        out_console.print(
            f"target met: {result.metric:.6g} vs baseline {result.baseline:.6g} (target {result.target:.6g}); "
            f"{len(result.plan.fp32_instances)} of {len(result.candidates)} op instances in FP32; "
            f"{share:.0%} of matmul/conv FLOPs in {options.dtype}; {result.evals} evaluations; "
            f"forward {lat['tuned']:.2f} ms vs {lat['fp32']:.2f} ms FP32; wrote {out}/", markup=False)
        if result.stopped:
            out_console.print(f"search cut short ({result.stopped}): this is the best confirmed plan so far", markup=False)
        return
    out_console.print(f"target not met: no plan reached {result.target:.6g} (baseline {result.baseline:.6g}) in "
                      f"{result.evals} evaluations" + (f"; search cut short ({result.stopped})" if result.stopped else "")
                      + f"; wrote {out}/ with the all-FP32 plan", markup=False)
    ctx.exit(exitcodes.TARGET_NOT_MET)

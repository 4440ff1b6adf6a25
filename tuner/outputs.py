"""Everything `mpt tune` writes into the output folder: plan, op lists, checkpoint, report, picture.

The outputs are committed as a set: the old `plan.yaml` is removed first, every
file is written into a staging folder inside the output folder, and the files
are then renamed into place with `plan.yaml` (the file that claims success)
last. A failed write (disk full, permission) raises OutputError naming the
file and the cause and leaves no plan.yaml; an interrupted write leaves none
either. `report.json` embeds the plan's own dict, so the two cannot disagree.
"""
from __future__ import annotations

import contextlib
import dataclasses
import html
import json
import math
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from .api import attach, attached, detach
from .checkpoint import CHECKPOINT_NAME, plan_pass, save_checkpoint
from .errors import OutputError
from .fileio import atomic_write_text
from .fingerprint import sha256_file
from .inputs import ModelInputs
from .journal import INPUTS_NAME, JOURNAL_NAME
from .plan import ModelRef, Plan
from .policy import write_op_list
from .shares import Shares
from .tune import TuneResult, TuneStatus

PLAN_NAME = "plan.yaml"
# Written in this order; plan.yaml last.
COMMITTED = ("lower_precision_ops.txt", "fp32_ops.txt", CHECKPOINT_NAME, "report.json", "search.html", PLAN_NAME)
OUTPUT_FILES = COMMITTED + (JOURNAL_NAME, INPUTS_NAME)


def _op_type_lists(result: TuneResult) -> tuple[set[str], set[str]]:
    """Op types for HMP/Gaudi-style lists: a type goes to FP32 only when all its instances fell back."""
    policy = result.plan.policy()
    fp32_inst = {i.key() for i in result.plan.fp32_instances}
    by_type: dict[str, list[bool]] = {}
    for c in result.candidates:
        by_type.setdefault(c.op, []).append(c.key() in fp32_inst)
    all_back = {op for op, flags in by_type.items() if flags and all(flags)}
    lower = (set(policy.lower) - all_back) | {op for op, flags in by_type.items()
                                               if not all(flags) and policy.rule_for(op)[0] == "lower"}
    fp32 = set(policy.fp32) | (all_back & (set(policy.lower) | set(by_type)))
    return lower - fp32, fp32


def _svg_plot(result: TuneResult) -> str:
    pts = [(t.low_share, t.metric, t.passed, t.label) for t in result.trials if t.metric is not None
           and math.isfinite(t.metric)]
    w, h, pad = 640, 360, 50
    metrics = [p[1] for p in pts] + [result.target, result.baseline]
    lo, hi = min(metrics), max(metrics)
    if hi - lo < 1e-12:
        lo, hi = lo - 1, hi + 1
    span = hi - lo
    lo, hi = lo - 0.05 * span, hi + 0.05 * span
    x = lambda s: pad + s * (w - 2 * pad)  # noqa: E731
    y = lambda m: h - pad - (m - lo) / (hi - lo) * (h - 2 * pad)  # noqa: E731
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
             f'<rect x="{pad}" y="{pad}" width="{w - 2 * pad}" height="{h - 2 * pad}" fill="none" stroke="#888"/>',
             f'<line x1="{pad}" x2="{w - pad}" y1="{y(result.target):.1f}" y2="{y(result.target):.1f}" '
             f'stroke="#c00" stroke-dasharray="6,4"/>',
             f'<text x="{w - pad - 4}" y="{y(result.target) - 4:.1f}" text-anchor="end" fill="#c00">target '
             f'{result.target:.4g}</text>',
             f'<text x="{w / 2}" y="{h - 12}" text-anchor="middle">share of op calls in lower precision</text>',
             f'<text x="14" y="{h / 2}" transform="rotate(-90 14 {h / 2})" text-anchor="middle">metric</text>']
    for frac in (0, 0.25, 0.5, 0.75, 1.0):
        parts.append(f'<text x="{x(frac):.1f}" y="{h - pad + 14}" text-anchor="middle">{frac:.0%}</text>')
    for val in (lo, (lo + hi) / 2, hi):
        parts.append(f'<text x="{pad - 4}" y="{y(val) + 4:.1f}" text-anchor="end">{val:.4g}</text>')
    for share, metric, passed, label in pts:
        color = "#1a7f37" if passed else "#c00"
        parts.append(f'<circle cx="{x(share):.1f}" cy="{y(metric):.1f}" r="5" fill="{color}" fill-opacity="0.7">'
                     f'<title>{html.escape(label)}: {metric:.6g}</title></circle>')
    parts.append("</svg>")
    return "\n".join(parts)


def _html(result: TuneResult, report: dict[str, Any]) -> str:
    rows = "\n".join(
        f"<tr><td>{t.n}</td><td>{html.escape(t.label)}</td><td>{'' if t.metric is None else f'{t.metric:.6g}'}</td>"
        f"<td>{'pass' if t.passed else 'fail'}</td><td>{t.low_share:.0%}</td><td>{t.seconds:.2f}</td>"
        f"<td>{html.escape(t.error or '')}</td></tr>" for t in result.trials)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>mpt tune: search</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:3px 8px}}</style>
</head><body><h1>mpt tune: {html.escape(report['dtype'])} search</h1>
<p>Baseline {result.baseline:.6g}, target {result.target:.6g}, tuned {report['final_metric']}, {result.evals} full evaluations.
Green: trial met the target; red: it did not. Dashed line: the target.</p>
{_svg_plot(result)}
<h2>Trials</h2><table><tr><th>#</th><th>trial</th><th>metric</th><th>result</th><th>low-precision share</th><th>seconds</th><th>error</th></tr>
{rows}</table></body></html>"""


@contextlib.contextmanager
def _writing(out: Path, name: str) -> Iterator[None]:
    """OSError while writing `name` -> OutputError naming the final path and the cause."""
    try:
        yield
    except OSError as exc:
        raise OutputError(f"cannot write {out / name}: {exc.strerror or exc}") from None


def write_outputs(result: TuneResult, out: str | Path, *, model: nn.Module, model_ref: ModelRef | None = None,
                  device: str = "cpu", latency: bool = True) -> dict[str, Any]:
    """Write the outputs as a set (see the module docstring); returns the report.

    `model` is the FP32 model as built: its weights go into the checkpoint
    (no copy of the model is made), one recorded forward under the plan gives
    the lowered parameters and the low-precision shares, and the latency is
    measured on this same model with the plan attached and detached in turn.
    `latency=False` skips the timing (`latency_ms` is null in report.json).
    """
    out = Path(out)
    with _writing(out, PLAN_NAME):
        (out / PLAN_NAME).unlink(missing_ok=True)
    with _writing(out, ".mpt-staging"):
        stage = Path(tempfile.mkdtemp(prefix=".mpt-staging-", dir=out))
    try:
        report = _write_staged(result, stage, out, model=model, model_ref=model_ref, device=device,
                               latency=latency)
        for name in COMMITTED:
            with _writing(out, name):
                os.replace(stage / name, out / name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return report


def _write_staged(result: TuneResult, stage: Path, out: Path, *, model: nn.Module, model_ref: ModelRef | None,
                  device: str, latency: bool) -> dict[str, Any]:
    t0 = time.monotonic()
    inputs = ModelInputs() if result.inputs is None else ModelInputs.of(result.inputs)
    lower, fp32 = _op_type_lists(result)
    n_inst = len(result.plan.fp32_instances)
    note = (f"{n_inst} op instance(s) fall back to FP32 individually; plan.yaml has them "
            "(op-type lists cannot express single instances)") if n_inst else ""
    with _writing(out, "lower_precision_ops.txt"):
        write_op_list(stage / "lower_precision_ops.txt", lower,
                      header=f"mpt tune: ops that run in {result.plan.dtype} (preset {result.plan.preset})\n{note}".strip())
    with _writing(out, "fp32_ops.txt"):
        write_op_list(stage / "fp32_ops.txt", fp32, header=f"mpt tune: ops that run in FP32 (preset {result.plan.preset})")
    planned = plan_pass(model, result.plan, inputs)
    with _writing(out, CHECKPOINT_NAME):
        ckpt = save_checkpoint(model, result.plan, inputs, stage / CHECKPOINT_NAME, lowered=planned.lowered)
        digest = sha256_file(stage / CHECKPOINT_NAME)
    plan = dataclasses.replace(result.plan, model=model_ref, checkpoint_sha256=digest)
    header = (f"status {result.status.value}" + (f", cut short: {result.stopped.value}" if result.stopped else "") +
              f"; baseline {result.baseline:.6g}, tuned {result.metric}, {result.evals} evaluations")
    with _writing(out, PLAN_NAME):
        plan.save(stage / PLAN_NAME, header=header)
    warnings = list(result.warnings)
    timing = _latency(model, result, inputs, device, warnings) if latency else None
    report = _report(result, plan, planned.shares, timing, ckpt, warnings, time.monotonic() - t0)
    report["execution"] = _execution(model, plan)
    with _writing(out, "report.json"):
        atomic_write_text(stage / "report.json", json.dumps(report, indent=1, default=str) + "\n")
    with _writing(out, "search.html"):
        atomic_write_text(stage / "search.html", _html(result, report))
    return report


def _execution(model: nn.Module, plan: Plan) -> dict[str, Any]:
    """How `tuner.load` will run this plan on this machine (native, scoped or python), from one attach."""
    attach(model, plan)
    try:
        ex = attached(model)
    finally:
        detach(model)
    assert ex is not None
    return {"path": ex.path.value, "summary": ex.describe(), "fp32_islands": list(ex.fp32_islands),
            "fp32_subtrees": list(ex.fp32_subtrees), "python_modules": list(ex.python_modules)}


def _latency(model: nn.Module, result: TuneResult, inputs: ModelInputs, device: str,
             warnings: list[str]) -> dict[str, Any] | None:
    """compare_latency for the report, and the warnings it calls for (None when the tuned model raised)."""
    try:
        timing = compare_latency(model, result.plan, inputs, device=device)
    except Exception as exc:  # noqa: BLE001 - the outputs are still worth writing; say why there is no timing
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        warnings.append(f"the tuned model raised when run the way tuner.load runs it, so it was not timed: "
                        f"{type(exc).__name__}: {first}")
        return None
    noise = max(0.05, timing["fp32_spread"], timing["tuned_spread"])
    if timing["tuned"] > timing["fp32"] * (1 + noise) and result.status is TuneStatus.MET:  # not met: all FP32
        warnings.append(f"the tuned model ran slower than FP32 on {device} ({timing['tuned']:.2f} ms vs "
                        f"{timing['fp32']:.2f} ms per forward on example_inputs): {result.plan.dtype} does not pay "
                        "off here (slow lower-precision kernels, or a model too small for casts to be worth it)")
    return timing


def compare_latency(model: nn.Module, plan: Plan, inputs: ModelInputs | tuple, *, device: str = "cpu",
                    min_time: float = 0.6, min_rounds: int = 3, max_rounds: int = 100) -> dict[str, Any]:
    """Milliseconds per forward of `model` in FP32 and with `plan` attached (`tuner.attach`, as `tuner.load`).

    One model, no copy: each round times one FP32 call and then one call with
    the plan attached (detached again in a finally), so drifts in clock speed
    or load hit both alike; one warm-up call of each comes first. Rounds go on
    until `min_time` seconds have passed and at least `min_rounds` ran. Returns
    the medians, the speedup (fp32 / tuned) and each side's spread, the
    interquartile range over the median. The attached model casts its FP32
    weights on every call, where the loaded checkpoint already stores them
    lowered: `tuned` errs on the slow side (`tuned_weights: "cast per call"`).
    """
    inputs = ModelInputs.of(inputs)
    plain = dataclasses.replace(plan, model=None)  # the same model: no structure check per round
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else None

    def timed() -> float:
        t0 = time.perf_counter()
        inputs.call(model)
        if sync is not None:
            sync()
        return time.perf_counter() - t0

    def tuned() -> float:
        attach(model, plain)
        try:
            return timed()
        finally:
            detach(model)

    fp32_s: list[float] = []
    tuned_s: list[float] = []
    with torch.no_grad():
        timed()  # warm-up of each
        tuned()
        start = time.perf_counter()
        while len(fp32_s) < min_rounds or (time.perf_counter() - start < min_time and len(fp32_s) < max_rounds):
            fp32_s.append(timed())
            tuned_s.append(tuned())
    fp32_ms, tuned_ms = statistics.median(fp32_s) * 1e3, statistics.median(tuned_s) * 1e3
    return {"fp32": fp32_ms, "tuned": tuned_ms, "speedup": fp32_ms / tuned_ms if tuned_ms else None,
            "fp32_spread": _spread(fp32_s), "tuned_spread": _spread(tuned_s), "rounds": len(fp32_s),
            "order": "interleaved", "tuned_weights": "cast per call"}


def _spread(samples: list[float]) -> float:
    """(p75 - p25) / median: the timing noise, relative."""
    if len(samples) < 2:
        return 0.0
    q1, median, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return (q3 - q1) / median if median else 0.0


def _report(result: TuneResult, plan: Plan, shares: Shares, latency: dict[str, Any] | None, ckpt: dict[str, Any],
            warnings: list[str], write_seconds: float) -> dict[str, Any]:
    return {
        "version": 1,
        "status": result.status.value,
        "stopped": result.stopped.value if result.stopped else None,
        "dtype": plan.dtype,
        "preset": plan.preset,
        "baseline_metric": result.baseline,
        "noise": result.noise,
        "target": result.target,
        "final_metric": result.metric,
        "evaluations": result.evals,
        "rebuilds": result.rebuilds,
        "notes": result.notes,
        "warnings": warnings,
        "candidates": len(result.candidates),
        "fp32_instances": [i.label() for i in plan.fp32_instances],
        "low_precision_call_share": shares.call_share,
        "low_precision_flop_share": shares.flop_share,
        "latency_ms": latency,
        "checkpoint": ckpt,
        "seconds": {"total": result.seconds + write_seconds, "evaluations": result.eval_seconds,
                    "user_code": result.user_seconds},
        "scores": result.scores,
        "plan": plan.to_dict(),
        "trials": [{"n": t.n, "label": t.label, "fp32": list(t.fp32), "metric": t.metric, "passed": t.passed,
                    "baseline": t.baseline, "seconds": t.seconds, "low_share": t.low_share, "error": t.error,
                    "from_journal": t.from_journal} for t in result.trials],
    }

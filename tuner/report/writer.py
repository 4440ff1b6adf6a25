"""Everything `mpt tune` writes into the output folder: plan, op lists, checkpoint, report, report.md, picture.

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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tuner.core.errors import OutputError
from tuner.core.fileio import atomic_write_text
from tuner.core.fingerprint import sha256_file
from tuner.core.inputs import ModelInputs
from tuner.engine.attach import attach, attached, detach
from tuner.measure.shares import Shares, share_text
from tuner.policy.plan import ModelRef, Plan
from tuner.policy.presets import write_op_list
from tuner.report.checkpoint import CHECKPOINT_NAME, plan_pass, save_checkpoint
from tuner.search.types import TuneResult, TuneStatus
from tuner.workspace.journal import INPUTS_NAME, JOURNAL_NAME

PLAN_NAME = "plan.yaml"
# Written in this order; plan.yaml last.
COMMITTED = ("lower_precision_ops.txt", "fp32_ops.txt", CHECKPOINT_NAME, "report.json", "search.html", "report.md",
             PLAN_NAME)
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


def fmt_metric(value: float | None) -> str:
    """A metric as every output writes it: 4 significant digits (`0.9852`), `-` for none."""
    return "-" if value is None else f"{value:.4g}"


def _nice_ticks(lo: float, hi: float, n: int = 5) -> tuple[list[float], int]:
    """Round tick values spanning [lo, hi] and the decimals that tell them apart."""
    raw = (hi - lo) / max(1, n - 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    ticks = [first + i * step for i in range(n + 2) if first + i * step <= hi + step * 1e-9]
    return ticks, max(0, -math.floor(math.log10(step)) + (1 if step / mag == 2.5 else 0))


def _front(pts: list[tuple[float, float]], lower_is_better: bool) -> list[tuple[float, float]]:
    """The trade-off curve: trials no other trial beats on both share and metric, by share."""
    better = (lambda a, b: a <= b) if lower_is_better else (lambda a, b: a >= b)  # noqa: E731
    front = [p for p in pts if not any(q != p and q[0] >= p[0] and better(q[1], p[1]) for q in pts)]
    return sorted(set(front))


def _svg_plot(result: TuneResult) -> str:
    """Metric against the lower-precision FLOP share: every trial numbered, the target, the chosen plan."""
    trials = [t for t in result.trials if t.metric is not None and math.isfinite(t.metric)]
    w, h, left, right, top, bottom = 760, 440, 78, 24, 56, 58
    metrics = [t.metric for t in trials] + [result.target, result.baseline]
    lo, hi = min(metrics), max(metrics)
    if hi - lo < 1e-12:
        lo, hi = lo - max(1e-3, abs(lo) * 0.01), hi + max(1e-3, abs(hi) * 0.01)
    span = hi - lo
    lo, hi = lo - 0.08 * span, hi + 0.08 * span
    x = lambda s: left + s * (w - left - right)  # noqa: E731
    y = lambda m: h - bottom - (m - lo) / (hi - lo) * (h - top - bottom)  # noqa: E731
    ty = y(result.target)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" '
             f'font-size="12" role="img" aria-label="metric against lower-precision FLOP share">',
             f'<rect x="{left}" y="{top}" width="{w - left - right}" height="{h - top - bottom}" fill="#fcfcfc" '
             'stroke="#888"/>']
    ticks, decimals = _nice_ticks(lo, hi)
    for val in ticks:
        parts.append(f'<line x1="{left}" x2="{w - right}" y1="{y(val):.1f}" y2="{y(val):.1f}" stroke="#eee"/>'
                     f'<text x="{left - 6}" y="{y(val) + 4:.1f}" text-anchor="end">{val:.{decimals}f}</text>')
    for frac in (0, 0.25, 0.5, 0.75, 1.0):
        parts.append(f'<line x1="{x(frac):.1f}" x2="{x(frac):.1f}" y1="{top}" y2="{h - bottom}" stroke="#eee"/>'
                     f'<text x="{x(frac):.1f}" y="{h - bottom + 16}" text-anchor="middle">{frac:.0%}</text>')
    parts += [f'<text x="{(left + w - right) / 2}" y="{h - 12}" text-anchor="middle">'
              f'share of matmul/conv FLOPs in {html.escape(result.plan.dtype)}</text>',
              f'<text x="18" y="{(top + h - bottom) / 2}" transform="rotate(-90 18 {(top + h - bottom) / 2})" '
              'text-anchor="middle">metric</text>',
              f'<line x1="{left}" x2="{w - right}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="#c00" stroke-dasharray="6,4"/>',
              # at the left, on the side away from the baseline: clear of the plans (right) and the baseline
              f'<text x="{left + 28}" y="{ty + 15 if result.baseline >= result.target else ty - 6:.1f}" '
              f'fill="#c00">target {fmt_metric(result.target)}</text>']
    lower_is_better = bool(result.plan.metrics.get("lower_is_better")) if result.plan.metrics else False
    front = _front([(t.shares.flop_share, t.metric) for t in trials if t.passed], lower_is_better)
    if len(front) > 1:
        path = " ".join(f"{x(sx):.1f},{y(m):.1f}" for sx, m in front)
        parts.append(f'<polyline points="{path}" fill="none" stroke="#1a7f37" stroke-opacity="0.5" stroke-width="2"/>')
    labels: dict[tuple[int, int], list[int]] = {}
    for t in trials:
        cx, cy = x(t.shares.flop_share), y(t.metric)
        color = "#777" if t.baseline else "#1a7f37" if t.passed else "#c00"
        if t.n == result.chosen:
            parts.append(f'<path d="M{cx:.1f},{cy - 10:.1f} L{cx + 10:.1f},{cy:.1f} L{cx:.1f},{cy + 10:.1f} '
                         f'L{cx - 10:.1f},{cy:.1f} Z" fill="none" stroke="#0550ae" stroke-width="2.5"/>')
        parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="5" fill="{color}" fill-opacity="0.8">'
                     f'<title>trial {t.n}: {html.escape(t.label)}; metric {fmt_metric(t.metric)}; '
                     f'{t.shares.short()}</title></circle>')
        labels.setdefault((round(cx), round(cy)), []).append(t.n)
    for (cx, cy), ns in labels.items():
        text = ",".join(map(str, ns)) if len(ns) <= 4 else f"{ns[0]}-{ns[-1]}"
        anchor, dx = ("end", -12) if cx > w - right - 40 else ("start", 12)
        parts.append(f'<text x="{cx + dx}" y="{cy - 9}" text-anchor="{anchor}" font-size="11">{text}</text>')
    legend = [("#777", "circle", "FP32 baseline"), ("#1a7f37", "circle", "met the target"),
              ("#c00", "circle", "missed the target"), ("#0550ae", "diamond", "chosen plan"),
              ("#c00", "dash", "target")]
    lx = left
    for color, shape, text in legend:
        if shape == "circle":
            parts.append(f'<circle cx="{lx + 6}" cy="{top - 22}" r="5" fill="{color}" fill-opacity="0.8"/>')
        elif shape == "diamond":
            parts.append(f'<path d="M{lx + 6},{top - 30} L{lx + 14},{top - 22} L{lx + 6},{top - 14} '
                         f'L{lx - 2},{top - 22} Z" fill="none" stroke="{color}" stroke-width="2.5"/>')
        else:
            parts.append(f'<line x1="{lx - 2}" x2="{lx + 16}" y1="{top - 22}" y2="{top - 22}" stroke="{color}" '
                         'stroke-dasharray="6,4"/>')
        parts.append(f'<text x="{lx + 20}" y="{top - 18}">{text}</text>')
        lx += 30 + 7 * len(text)
    parts.append("</svg>")
    return "\n".join(parts)


def _share(report: dict[str, Any]) -> str:
    return share_text(report["low_precision_flop_share"], report["low_precision_call_share"], report["dtype"])


def verdict(result: TuneResult, report: dict[str, Any]) -> str:
    """One sentence: met or not, baseline -> tuned vs target, the share (tuner.measure.shares), evaluations."""
    share = _share(report)
    if result.status is TuneStatus.MET:
        head = (f"target met: baseline {fmt_metric(result.baseline)} -> tuned {fmt_metric(result.metric)} "
                f"(target {fmt_metric(result.target)}), trial {result.chosen}")
    else:
        head = (f"target not met: no plan reached {fmt_metric(result.target)} (baseline "
                f"{fmt_metric(result.baseline)}); the plan is all FP32")
    return f"{head}; {share}; {len(result.plan.fp32_instances)} of {len(result.candidates)} op instances in FP32; " \
           f"{result.evals} evaluations"


def _html(result: TuneResult, report: dict[str, Any]) -> str:
    def row(t: Any) -> str:
        verdict = "baseline" if t.baseline else "pass" if t.passed else "fail"
        mark = ' class="chosen"' if t.n == result.chosen else ""
        return (f"<tr{mark}><td>{t.n}</td><td>{html.escape(t.label)}{' (chosen)' if mark else ''}</td>"
                f"<td>{fmt_metric(t.metric)}</td><td>{verdict}</td><td>{t.shares.short()}</td>"
                f"<td>{t.seconds:.2f}</td><td>{html.escape(t.error or '')}</td></tr>")

    rows = "\n".join(row(t) for t in result.trials)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>mpt tune: search</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:980px}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:left}}tr.chosen{{background:#ddf4ff;font-weight:bold}}</style>
</head><body><h1>mpt tune: {html.escape(report['dtype'])} search</h1>
<p><b>{html.escape(verdict(result, report))}</b>.</p>
<p>Each dot is one full evaluation, numbered as in the terminal and report.json (trials 1 and 2: the FP32
baseline). Right is more of the model in {html.escape(report['dtype'])}; the green line joins the best plans
that met the target.</p>
{_svg_plot(result)}
<h2>Trials</h2><table><tr><th>#</th><th>trial</th><th>metric</th><th>result</th><th>lower-precision share</th>
<th>seconds</th><th>error</th></tr>
{rows}</table></body></html>"""


def _markdown(result: TuneResult, report: dict[str, Any], out: Path) -> str:
    """report.md: what a CI job posts as a pull-request comment."""
    fp32 = report["fp32_instances"]
    top = ", ".join(f"`{i}`" for i in fp32[:5]) + (f" and {len(fp32) - 5} more" if len(fp32) > 5 else "")
    status = "✅ target met" if result.status is TuneStatus.MET else "❌ target not met"
    lines = [f"### mpt tune: {report['dtype']} — {status}", "",
             "| | |", "|---|---|",
             f"| baseline → tuned | {fmt_metric(result.baseline)} → {fmt_metric(result.metric)} |",
             f"| target | {fmt_metric(result.target)} |",
             f"| in {report['dtype']} | {_share(report)} |",
             f"| evaluations | {result.evals}" + (f" (chosen: trial {result.chosen})" if result.chosen else "") + " |",
             f"| FP32 op instances | {len(fp32)} of {report['candidates']}" + (f": {top}" if fp32 else "") + " |"]
    if report["latency_ms"]:
        lat = report["latency_ms"]
        lines.append(f"| forward | {lat['tuned']:.2f} ms vs {lat['fp32']:.2f} ms FP32 |")
    if result.stopped:
        lines.append(f"| cut short | {result.stopped.value} |")
    lines += ["", *[f"> warning: {w}" for w in report["warnings"]], "",
              "Load the tuned model:", "", "```python", "import tuner",
              f'model = tuner.load(build_model(), "{out}")', "```", ""]
    return "\n".join(lines)


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
    # the chosen trial's shares as measured under the final plan: the same numbers as the summary's
    result = dataclasses.replace(result, trials=[dataclasses.replace(t, shares=planned.shares)
                                                 if t.n == result.chosen else t for t in result.trials])
    report = _report(result, plan, planned.shares, timing, ckpt, warnings, time.monotonic() - t0)
    report["execution"] = _execution(model, plan)
    with _writing(out, "report.json"):
        atomic_write_text(stage / "report.json", json.dumps(report, indent=1, default=str) + "\n")
    with _writing(out, "search.html"):
        atomic_write_text(stage / "search.html", _html(result, report))
    with _writing(out, "report.md"):
        atomic_write_text(stage / "report.md", _markdown(result, report, out))
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
        **shares.to_dict(),
        "chosen_trial": result.chosen,
        "latency_ms": latency,
        "checkpoint": ckpt,
        "seconds": {"total": result.seconds + write_seconds, "evaluations": result.eval_seconds,
                    "user_code": result.user_seconds},
        "scores": result.scores,
        "plan": plan.to_dict(),
        "trials": [{"n": t.n, "label": t.label, "fp32": list(t.fp32), "metric": t.metric, "passed": t.passed,
                    "baseline": t.baseline, "seconds": t.seconds,
                    "low_precision_flop_share": t.shares.flop_share, "error": t.error,
                    "from_journal": t.from_journal} for t in result.trials],
    }

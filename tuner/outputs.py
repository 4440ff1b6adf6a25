"""Everything `mpt tune` writes into --out: plan, op lists, checkpoint, report, picture.

Each file is written under a temporary name and renamed, so an interrupted run
never leaves a half-written output.
"""
from __future__ import annotations

import copy
import html
import json
import math
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from .api import attach
from .audit import inspect_model
from .checkpoint import CHECKPOINT_NAME, save_checkpoint
from .errors import ConfigError
from .fileio import atomic_write_text
from .journal import JOURNAL_NAME
from .policy import write_op_list
from .tune import TuneResult

OUTPUT_FILES = ("plan.yaml", "lower_precision_ops.txt", "fp32_ops.txt", CHECKPOINT_NAME, "report.json",
                "search.html", JOURNAL_NAME)


def prepare_out_dir(out: str | Path, *, resume: bool, overwrite: bool) -> Path:
    """Check --out before any work: not a file, writable, and not another run's folder."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a folder")
    if out.is_dir():
        held = [n for n in OUTPUT_FILES if (out / n).exists()]
        if held and not (resume or overwrite):
            raise ConfigError(f"--out {out} already holds a run ({', '.join(held[:3])}); "
                              "pass --resume to continue it or --overwrite to replace it")
        if overwrite and not resume:
            for n in held:
                (out / n).unlink()
    else:
        try:
            out.mkdir(parents=True)
        except OSError as exc:
            raise ConfigError(f"cannot create --out {out}: {exc.strerror}") from None
    probe = out / ".mpt-write-test"
    try:
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"--out {out} is not writable: {exc.strerror}") from None
    return out


def measure_latency(fn: Callable[[], Any], *, min_time: float = 0.3, max_iters: int = 200) -> float:
    """Median seconds per call (after one warm-up)."""
    with torch.no_grad():
        fn()
        times: list[float] = []
        start = time.perf_counter()
        while len(times) < 3 or (time.perf_counter() - start < min_time and len(times) < max_iters):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


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


def write_outputs(result: TuneResult, build: Callable[[], nn.Module], out: str | Path, *,
                  device: str = "cpu", model_file: str = "") -> dict[str, Any]:
    """Write plan.yaml, op lists, model.safetensors, report.json and search.html; returns the report."""
    out = Path(out)
    t0 = time.monotonic()
    plan = result.plan
    model = build().to(device).eval()
    inputs = result.inputs or ()
    header = (f"model: {model_file}\n" if model_file else "") + \
             f"baseline {result.baseline:.6g}, tuned {result.metric}, {result.evals} evaluations, status {result.status}"
    plan.save(out / "plan.yaml", header=header)
    lower, fp32 = _op_type_lists(result)
    n_inst = len(plan.fp32_instances)
    note = (f"{n_inst} op instance(s) fall back to FP32 individually; plan.yaml has them "
            "(op-type lists cannot express single instances)") if n_inst else ""
    write_op_list(out / "lower_precision_ops.txt", lower,
                  header=f"mpt tune: ops that run in {plan.dtype} (preset {plan.preset})\n{note}".strip())
    write_op_list(out / "fp32_ops.txt", fp32, header=f"mpt tune: ops that run in FP32 (preset {plan.preset})")
    ckpt = save_checkpoint(model, plan, inputs, out / CHECKPOINT_NAME)

    summary = inspect_model(model, inputs, plan, local_errors=False).summary
    fp32_model = build().to(device).eval()
    tuned = copy.deepcopy(fp32_model)
    from .checkpoint import load

    load(tuned, out)
    lat_fp32 = measure_latency(lambda: fp32_model(*inputs))
    lat_tuned = measure_latency(lambda: tuned(*inputs))
    warnings = list(result.warnings)
    if lat_tuned > lat_fp32 * 1.05 and result.status == "ok":  # not met: the plan is all FP32, nothing to speed up
        warnings.append(f"the tuned model ran slower than FP32 on {device} ({lat_tuned * 1e3:.2f} ms vs "
                        f"{lat_fp32 * 1e3:.2f} ms per forward on example_inputs): {plan.dtype} does not pay off "
                        "here (slow lower-precision kernels, or a model too small for casts to be worth it)")
    report = {
        "version": 1,
        "status": result.status,
        "dtype": plan.dtype,
        "preset": plan.preset,
        "baseline_metric": result.baseline,
        "target": result.target,
        "final_metric": result.metric,
        "evaluations": result.evals,
        "stopped": result.stopped,
        "notes": result.notes,
        "warnings": warnings,
        "candidates": len(result.candidates),
        "fp32_instances": [i.label() for i in plan.fp32_instances],
        "low_precision_call_share": summary.lower_call_share,
        "low_precision_flop_share": summary.lower_flop_share,
        "latency_ms": {"fp32": lat_fp32 * 1e3, "tuned": lat_tuned * 1e3, "speedup": lat_fp32 / lat_tuned},
        "checkpoint": ckpt,
        "seconds": {"total": result.seconds + (time.monotonic() - t0), "evaluations": result.eval_seconds,
                    "user_code": result.user_seconds},
        "scores": result.scores,
        "trials": [{"n": t.n, "label": t.label, "fp32": list(t.fp32), "metric": t.metric, "passed": t.passed,
                    "seconds": t.seconds, "low_share": t.low_share, "error": t.error, "from_journal": t.from_journal}
                   for t in result.trials],
    }
    atomic_write_text(out / "report.json", json.dumps(report, indent=1, default=str) + "\n")
    atomic_write_text(out / "search.html", _html(result, report))
    return report

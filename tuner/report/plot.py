"""search.html's picture: each trial's metric against its lower-precision FLOP share, as an inline SVG."""
from __future__ import annotations

import html
import math

from tuner.report.labels import Box, marker_box, place_labels
from tuner.report.metric_text import fmt_metric
from tuner.report.outcome import TuneReport
from tuner.report.verdict import run_digits
from tuner.search.results import TuneResult


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
    better = (lambda a, b: a <= b) if lower_is_better else (lambda a, b: a >= b)
    front = [p for p in pts if not any(q != p and q[0] >= p[0] and better(q[1], p[1]) for q in pts)]
    return sorted(set(front))


def svg_plot(result: TuneResult, report: TuneReport) -> str:
    """Metric against the lower-precision FLOP share: every trial numbered, the target, the chosen plan."""
    points = [(t, t.metric) for t in report.trials if t.metric is not None and math.isfinite(t.metric)]
    w, h, right, top, bottom = 760, 440, 24, 56, 58
    metrics = [m for _, m in points] + [result.target, result.baseline]
    lo, hi = min(metrics), max(metrics)
    if hi - lo < 1e-12:
        lo, hi = lo - max(1e-3, abs(lo) * 0.01), hi + max(1e-3, abs(hi) * 0.01)
    span = hi - lo
    lo, hi = lo - 0.08 * span, hi + 0.08 * span
    ticks, decimals = _nice_ticks(lo, hi)
    # room for the widest tick label (12px digits at most 7.7 px) right of the rotated axis title at x=24
    left = max(78, 36 + math.ceil(7.7 * max(len(f"{v:.{decimals}f}") for v in ticks)))
    x = lambda s: left + s * (w - left - right)  # noqa: E731
    y = lambda m: h - bottom - (m - lo) / (hi - lo) * (h - top - bottom)  # noqa: E731
    ty = y(result.target)
    d = run_digits(result, report)
    target_text = f"target {fmt_metric(result.target, d)}"
    target_y = ty + 15 if result.baseline >= result.target else ty - 6
    # what no trial number may cover besides the dots: the target's text (12px) and the chosen plan's diamond
    obstacles: list[Box] = [(left + 28, target_y - 11, left + 28 + 7.5 * len(target_text), target_y + 3)]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" '
             f'font-size="12" role="img" aria-label="metric against lower-precision FLOP share">',
             f'<rect x="{left}" y="{top}" width="{w - left - right}" height="{h - top - bottom}" fill="#fcfcfc" '
             'stroke="#888"/>']
    for val in ticks:
        parts.append(f'<line x1="{left}" x2="{w - right}" y1="{y(val):.1f}" y2="{y(val):.1f}" stroke="#eee"/>'
                     f'<text x="{left - 9}" y="{y(val) + 4:.1f}" text-anchor="end">{val:.{decimals}f}</text>')
    for frac in (0, 0.25, 0.5, 0.75, 1.0):
        parts.append(f'<line x1="{x(frac):.1f}" x2="{x(frac):.1f}" y1="{top}" y2="{h - bottom}" stroke="#eee"/>'
                     f'<text x="{x(frac):.1f}" y="{h - bottom + 16}" text-anchor="middle">{frac:.0%}</text>')
    parts += [f'<text x="{(left + w - right) / 2}" y="{h - 12}" text-anchor="middle">'
              f'share of matmul/conv FLOPs in {html.escape(result.plan.dtype)}</text>',
              f'<text x="18" y="{(top + h - bottom) / 2}" transform="rotate(-90 18 {(top + h - bottom) / 2})" '
              'text-anchor="middle">metric</text>',
              f'<line x1="{left}" x2="{w - right}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="#c00" stroke-dasharray="6,4"/>',
              # at the left, on the side away from the baseline: clear of the plans (right) and the baseline
              f'<text x="{left + 28}" y="{target_y:.1f}" fill="#c00">{target_text}</text>']
    lower_is_better = bool(result.plan.metrics.get("lower_is_better")) if result.plan.metrics else False
    front = _front([(t.shares.flop_share, m) for t, m in points if t.passed], lower_is_better)
    if len(front) > 1:
        path = " ".join(f"{x(sx):.1f},{y(m):.1f}" for sx, m in front)
        parts.append(f'<polyline points="{path}" fill="none" stroke="#1a7f37" stroke-opacity="0.5" stroke-width="2"/>')
    labels: dict[tuple[int, int], list[int]] = {}
    for t, metric in points:
        cx, cy = x(t.shares.flop_share), y(metric)
        color = "#777" if t.baseline else "#1a7f37" if t.passed else "#c00"
        if t.n == result.chosen:
            parts.append(f'<path d="M{cx:.1f},{cy - 10:.1f} L{cx + 10:.1f},{cy:.1f} L{cx:.1f},{cy + 10:.1f} '
                         f'L{cx - 10:.1f},{cy:.1f} Z" fill="none" stroke="#0550ae" stroke-width="2.5"/>')
            obstacles.append(marker_box(cx, cy, 11.5))  # the diamond's reach with half its stroke
        obstacles.append(marker_box(cx, cy))
        parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="5" fill="{color}" fill-opacity="0.8">'
                     f'<title>trial {t.n}: {html.escape(t.label)}; metric {fmt_metric(metric, d)}; '
                     f'{t.shares.short()}</title></circle>')
        labels.setdefault((round(cx), round(cy)), []).append(t.n)
    area = (left, top, w - right, h - bottom)
    for label in place_labels(labels, area, obstacles):
        parts.append(f'<text x="{label.x:.0f}" y="{label.y:.0f}" text-anchor="{label.anchor}" font-size="11">'
                     f'{label.text}</text>')
    parts += _legend(left, top)
    parts.append("</svg>")
    return "\n".join(parts)


def _legend(left: int, top: int) -> list[str]:
    """The legend row above the plot: the markers and what they mean."""
    parts: list[str] = []
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
    return parts

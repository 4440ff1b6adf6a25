"""search.html: the run's facts and verdict, the FP32 instances and why, the plot of every trial and the table
of trials, in one self-contained page."""
from __future__ import annotations

import html
from pathlib import Path

from tuner.report.metric_text import fmt_metric
from tuner.report.outcome import TuneReport
from tuner.report.plot import svg_plot
from tuner.report.reasons import Fp32Reason, fallback_reasons, fp32_reasons, run_facts, score_header, score_note
from tuner.report.verdict import plan_share, run_digits, verdict
from tuner.search.results import Trial, TuneResult

_STYLE = """body{font-family:sans-serif;margin:2em;max-width:1000px;color:#1f2328}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}tr.chosen{background:#ddf4ff}
dl.facts{display:grid;grid-template-columns:max-content auto;gap:2px 16px}dl.facts dt{font-weight:bold}
dl.facts dd{margin:0}td.num{text-align:right;font-variant-numeric:tabular-nums}code{font-size:90%}
p.met{color:#1a7f37}p.missed{color:#c00}"""


def search_page(result: TuneResult, report: TuneReport, out: Path | None = None) -> str:
    """The text of search.html; `out`: the output folder (where the plan's paths start)."""
    dtype = html.escape(report.plan.dtype)
    d = run_digits(result, report)
    facts = run_facts(result, report, out)
    said = verdict(result, report)
    errors = any(t.error for t in report.trials)  # the column only where a trial's evaluate raised
    rows = "\n".join(_row(t, t.n == result.chosen, d, errors) for t in report.trials)
    latency = html.escape(report.latency.text() + _latency_spread(report)) if report.latency else "not timed"
    items = [("model", f"<code>{html.escape(facts.model)}</code>"), ("date", html.escape(facts.created)),
             ("total time", facts.time_text()), ("evaluations", f"{facts.evaluations}" +
                                                 (f" (chosen: trial {result.chosen})" if result.chosen else "")),
             ("baseline → tuned", f"{fmt_metric(result.baseline, d)} → {fmt_metric(result.metric, d)} "
                                  f"(target {fmt_metric(result.target, d)})"),
             (f"in {'16-bit' if report.plan.fallback else dtype}", html.escape(plan_share(report))),
             ("forward latency", latency)]
    dl = "\n".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items)
    name = html.escape(facts.model)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>mpt tune: {name} in {dtype}</title>
<style>{_STYLE}</style>
</head><body><h1>mpt tune: <code>{name}</code> in {dtype}</h1>
<p class="{'met' if said.met else 'missed'}"><b>{html.escape(str(said))}</b>.</p>
<dl class="facts">
{dl}
</dl>
{_fp32_section(result, report)}
{_fallback_section(result, report)}
<h2>Search</h2>
<p>Each dot is one full evaluation, numbered as in the terminal and report.json (trial 1: the FP32
baseline, and any trial marked as a baseline run). Right is more of the model in {dtype}; the green line
joins the best plans that met the target.</p>
{svg_plot(result, report)}
<h2>Trials</h2><p>Each trial says what it changed from the trial before it (<code>+N FP32</code>: kept in FP32,
<code>-N</code>: back in {dtype}; <code>*</code> stands for indices) and how many instances its plan keeps in FP32.</p>
<table><tr><th>#</th><th>what changed</th><th>metric</th><th>result</th><th>lower-precision share</th>
<th>seconds</th>{'<th>evaluate error</th>' if errors else ''}</tr>
{rows}</table></body></html>"""


def _latency_spread(report: TuneReport) -> str:
    lat = report.latency
    if lat is None:
        return ""
    return f"; spread (IQR/median) FP32 {lat.fp32_spread:.0%}, tuned {lat.tuned_spread:.0%}, {lat.rounds} rounds"


def _fp32_section(result: TuneResult, report: TuneReport) -> str:
    """The plan's FP32 instances, each with the trial that shows it is needed, its score and FLOP share."""
    n, total = len(report.plan.fp32_instances), len(result.candidates)
    if not n:
        return f"<h2>FP32 op instances</h2><p>None: all {total} candidates run in {html.escape(report.plan.dtype)}.</p>"
    dtype = report.plan.dtype
    rows = "\n".join(_reason_row(r, dtype) for r in fp32_reasons(result, report.trials))
    return (f"<h2>FP32 op instances ({n} of {total})</h2>\n<table><tr><th>op instance</th><th>why FP32</th>"
            f"<th>{html.escape(score_header(dtype))}</th><th>FLOP share</th></tr>\n{rows}</table>\n"
            f"<p>{html.escape(score_note(dtype))}</p>")


def _fallback_section(result: TuneResult, report: TuneReport) -> str:
    """The op instances a fallback chain runs in its other 16-bit dtype, and why (as report.md says it);
    nothing for a plan without them."""
    plan = report.plan
    if not plan.fallback_instances:
        return ""
    other, dtype = html.escape(str(plan.fallback)), html.escape(plan.dtype)
    rows = "\n".join(f"<tr><td><code>{html.escape(label)}</code></td><td>{html.escape(text)}</td></tr>"
                     for label, text in fallback_reasons(result, report))
    return (f"<h2>{other} op instances, the first fallback ({len(plan.fallback_instances)} of "
            f"{len(result.candidates)})</h2>\n<table><tr><th>op instance</th><th>why {other}, not {dtype} or FP32"
            f"</th></tr>\n{rows}</table>")


def _reason_row(r: Fp32Reason, dtype: str) -> str:
    return (f"<tr><td><code>{html.escape(r.label)}</code></td><td>{html.escape(r.text(dtype))}</td>"
            f'<td class="num">{html.escape(r.score_text())}</td><td class="num">{html.escape(r.flop_text())}</td>'
            "</tr>")


def _row(t: Trial, chosen: bool, digits: int, errors: bool) -> str:
    """One trial; `errors`: with the error its evaluate raised (or its metric's, not finite), when any did."""
    outcome = "baseline" if t.baseline else "pass" if t.passed else "fail"
    mark = ' class="chosen"' if chosen else ""
    return (f"<tr{mark}><td>{t.n}</td><td>{html.escape(t.label)}{' <b>(chosen)</b>' if mark else ''}</td>"
            f'<td class="num">{fmt_metric(t.metric, digits)}</td><td>{outcome}</td><td>{t.shares.short()}</td>'
            f'<td class="num">{t.seconds:.2f}</td>' + (f"<td>{html.escape(t.error or '')}</td>" if errors else "")
            + "</tr>")

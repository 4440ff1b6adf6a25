"""search.html: the verdict, the plot of every trial and the table of trials, in one self-contained page."""
from __future__ import annotations

import html

from tuner.report.metric_text import fmt_metric
from tuner.report.outcome import TuneReport
from tuner.report.plot import svg_plot
from tuner.report.verdict import run_digits, verdict
from tuner.search.results import Trial, TuneResult


def search_page(result: TuneResult, report: TuneReport) -> str:
    """The text of search.html."""
    dtype = html.escape(report.plan.dtype)
    d = run_digits(result, report)
    rows = "\n".join(_row(t, t.n == result.chosen, d) for t in report.trials)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>mpt tune: search</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:980px}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:left}}tr.chosen{{background:#ddf4ff;font-weight:bold}}</style>
</head><body><h1>mpt tune: {dtype} search</h1>
<p><b>{html.escape(str(verdict(result, report)))}</b>.</p>
<p>Each dot is one full evaluation, numbered as in the terminal and report.json (trials 1 and 2: the FP32
baseline). Right is more of the model in {dtype}; the green line joins the best plans
that met the target.</p>
{svg_plot(result, report)}
<h2>Trials</h2><table><tr><th>#</th><th>trial</th><th>metric</th><th>result</th><th>lower-precision share</th>
<th>seconds</th><th>error</th></tr>
{rows}</table></body></html>"""


def _row(t: Trial, chosen: bool, digits: int) -> str:
    outcome = "baseline" if t.baseline else "pass" if t.passed else "fail"
    mark = ' class="chosen"' if chosen else ""
    return (f"<tr{mark}><td>{t.n}</td><td>{html.escape(t.label)}{' (chosen)' if mark else ''}</td>"
            f"<td>{fmt_metric(t.metric, digits)}</td><td>{outcome}</td><td>{t.shares.short()}</td>"
            f"<td>{t.seconds:.2f}</td><td>{html.escape(t.error or '')}</td></tr>")

"""`mpt inspect`: per-op-call precision, reason and error."""
from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import click

from .common import guarded
from .options import INSPECT, command_options, options
from .render import console, fmt_err, is_tty
from .tables import PIPED_WIDTH, Column, Shorten, plain_table, rich_table, rule_abbrev, rule_legend, wrap_line

if TYPE_CHECKING:
    from tuner.measure.inspection import OpRecord

EPILOG = """\b
Examples:
  mpt inspect examples/digits_cnn.py                    # torch-cpu preset, bf16
  mpt inspect examples/digits_cnn.py --preset hmp --top 20   # the 20 calls that add the most error
  mpt inspect model.py --plan mpt-out/plan.yaml --json > ops.json
  mpt inspect model.py --lower-list bf16_ops.txt --fp32-list fp32_ops.txt
  mpt inspect --config configs/digits_sensor.yaml
"""

TOP_TITLE = "top {n} by own error (views, copies, eval dropout left out)"

# Shrinking order when a table is too wide: module paths first (down to 16), then op names, the dtypes,
# and module paths again; the rule (short names) and error columns keep their width.
_MODULE, _OP, _DTYPES = 0, 1, 2
_STAGES = ((_MODULE, 16), (_OP, 16), (_DTYPES, 10), (_MODULE, 8), (_OP, 8))
# Piped output is read by scripts and pasted into --module: a module path or op label is never cut there (a
# long path makes its lines longer than PIPED_WIDTH instead); only the input dtypes give way.
_PLAIN_STAGES = ((_DTYPES, 10),)

_TERMINAL_COLUMNS = (Column("module", shorten=Shorten.MIDDLE), Column("op", shorten=Shorten.MIDDLE),
                     Column("in > ran > out", shorten=Shorten.END), Column("error", right=True),
                     Column("local", right=True), Column("rule"))
_PLAIN_COLUMNS = (Column("module"), Column("op"),
                  Column("inputs", shorten=Shorten.END), Column("computed"), Column("output"),
                  Column("error", right=True), Column("local", right=True), Column("rule"))


def _terminal_row(r: OpRecord) -> list[str]:
    flow = f"{','.join(dict.fromkeys(r.input_dtypes)) or '-'} > {r.dtype} > {r.output_dtype}"
    return [r.module or "(root)", f"{r.op}#{r.index}", flow, fmt_err(r.error, 1), fmt_err(r.local_error, 1),
            rule_abbrev(r.rule)]


def _plain_row(r: OpRecord) -> list[str]:
    return [r.module or "(root)", f"{r.op}#{r.index}", ",".join(r.input_dtypes) or "-", r.dtype, r.output_dtype,
            fmt_err(r.error), fmt_err(r.local_error), rule_abbrev(r.rule)]


@click.command(INSPECT, epilog=EPILOG)
@options(INSPECT)
@guarded
def inspect_cmd(**values: Any) -> None:
    """Show what precision each op call runs in, why, and how much error it adds.

    Runs example_inputs() once in FP32 and once under the policy (a tuple is
    the positional args, a dict the keyword args), and lists for each op
    call: module path, op, input dtypes, the dtype it computed in, output
    dtype, the rule that decided it, its error against the FP32 run
    (`error`, everything upstream included) and the error the op adds by
    itself (`local`). --top N keeps the N calls with the largest `local`
    error (`error` breaks ties, and ranks calls that have no `local`),
    leaving out calls whose precision cannot change their result (views,
    reshape, permute, contiguous, dropout in eval). The rule column uses
    short names, spelled out in the line under the table; long module paths
    are shortened in the middle so that a row fits the terminal, and never
    when piped (whole paths paste into --module). The summary gives the share of op calls and of
    matmul/conv FLOPs that ran in the lower precision and the casts inserted.
    """
    from tuner.jobs.inspect_run import inspect
    from tuner.measure.shares import percent

    opts = command_options(values)  # tuner.options.commands.InspectOptions
    run = inspect(opts)
    shown, s, top = run.shown, run.summary, run.top
    if opts.json:
        json.dump(run.to_dict(), sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
        return
    split = ", ".join(f"{d} {percent(v)}" for d, v in s.flop_share_by_dtype.items() if d != "fp32")
    low = f"16-bit ({split})" if split else s.dtype  # a plan's fallback chain ran two 16-bit dtypes
    summary = (f"{s.policy} {s.dtype}: {s.lower_calls}/{s.calls} op calls ({percent(s.lower_call_share)}) and "
               f"{percent(s.lower_flop_share)} of matmul/conv FLOPs in {low}; {s.casts} casts inserted; "
               f"output error {fmt_err(s.output_error)}")
    out = console()
    legend = rule_legend(r.rule for r in shown)
    if is_tty():
        title = f"mpt inspect: {run.model_name}" + (f", {TOP_TITLE.format(n=len(shown))}" if top else "")
        styles = ["red" if r.nonfinite else ("cyan" if r.dtype in ("bf16", "fp16") else None) for r in shown]
        out.print(rich_table(_TERMINAL_COLUMNS, [_terminal_row(r) for r in shown], _STAGES, out.width,
                             title=title, styles=styles))
        out.print(legend)
    else:
        if top:
            out.print(TOP_TITLE.format(n=len(shown)))
        for line in plain_table(_PLAIN_COLUMNS, [_plain_row(r) for r in shown], _PLAIN_STAGES, PIPED_WIDTH):
            out.print(line)
        for line in wrap_line(legend):
            out.print(line)
    for r in shown:
        if r.kernel_note:
            out.print(f"{r.label}: {r.kernel_note}", markup=False)
    out.print(summary)
    if s.first_nonfinite:
        out.print(f"first non-finite output (NaN/inf) at {s.first_nonfinite}")

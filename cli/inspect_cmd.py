"""`mpt inspect`: per-op-call precision, reason and error."""
from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import click

from .common import guarded
from .options import INSPECT, options
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

_TERMINAL_COLUMNS = (Column("module", shorten=Shorten.MIDDLE), Column("op", shorten=Shorten.MIDDLE),
                     Column("in > ran > out", shorten=Shorten.END), Column("error", right=True),
                     Column("local", right=True), Column("rule"))
_PLAIN_COLUMNS = (Column("module", shorten=Shorten.MIDDLE), Column("op", shorten=Shorten.MIDDLE),
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
def inspect_cmd(model_file: str | None, preset: str | None, plan_path: str | None, dtype: str | None,
                module_overrides: tuple[str, ...], lower_list: str | None, fp32_list: str | None, as_json: bool,
                top: int | None, config_path: str | None, model_fn: str | None, eval_fn: str | None,
                inputs_fn: str | None) -> None:
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
    are shortened in the middle so that a row fits the terminal (120
    characters when piped). The summary gives the share of op calls and of
    matmul/conv FLOPs that ran in the lower precision and the casts inserted.
    """
    from tuner.core.errors import ConfigError
    from tuner.core.loader import load_user_model
    from tuner.measure.inspection import inspect_model, top_records

    if not model_file:
        raise ConfigError("missing MODEL.py: give it as the argument or as `model:` in --config")
    ctx = click.get_current_context()
    if preset and plan_path:
        from click.core import ParameterSource

        if ctx.get_parameter_source("preset") is ParameterSource.DEFAULT_MAP and \
                ctx.get_parameter_source("plan_path") is ParameterSource.COMMANDLINE:
            preset = None  # --plan on the command line wins over the config's preset
        else:
            raise ConfigError("give --preset or --plan, not both")
    if plan_path and (lower_list or fp32_list):
        raise ConfigError("--lower-list/--fp32-list change a preset's lists; they cannot be combined with --plan")
    mods: dict[str, str] = {}
    for item in module_overrides:
        if "=" not in item:
            raise ConfigError(f"--module expects PATH=DTYPE, found {item!r}")
        path, value = item.split("=", 1)
        mods[path.strip()] = value.strip()
    user = load_user_model(model_file, model=model_fn, eval=eval_fn, inputs=inputs_fn, require_eval=False)
    inputs = user.example_inputs()
    if inputs is None:
        raise ConfigError(f"{user.path.name} defines no example_inputs(); add one or pass --inputs NAME")
    model = user.build().eval()  # as mpt tune and mpt check run it: no dropout, BatchNorm's running stats
    policy: Any = plan_path if plan_path else (preset or "torch-cpu")
    if lower_list or fp32_list:
        from tuner.policy.presets import custom_policy, load_preset, read_op_list

        problems: list[str] = []
        lists: dict[str, list[str] | None] = {"lower": None, "fp32": None}
        for key, path in (("lower", lower_list), ("fp32", fp32_list)):
            if path:
                try:
                    lists[key] = read_op_list(path)
                except ConfigError as exc:
                    name = path.replace("\\", "/").rsplit("/", 1)[-1]
                    problems += [e if e.startswith(f"{name}:") or path in e else f"{path}: {e}" for e in exc.errors]
        if lists["lower"] is not None and lists["fp32"] is not None:
            both = sorted(set(lists["lower"]) & set(lists["fp32"]))
            if both:
                problems.append(f"op(s) in both --lower-list {lower_list} and --fp32-list {fp32_list}: "
                                f"{', '.join(both)}; an op runs in one precision")
        if problems:
            raise ConfigError(problems)
        policy = custom_policy(load_preset(policy), lower=lists["lower"], fp32=lists["fp32"])
    result = inspect_model(model, inputs, policy, dtype, modules=mods or None)
    records = result.records
    shown = top_records(records, top) if top else records
    if as_json:
        data = result.to_dict()
        position = {id(r): n for n, r in enumerate(records)}
        data["records"] = [data["records"][position[id(r)]] for r in shown]
        json.dump(data, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
        return
    s = result.summary
    summary = (f"{s.policy} {s.dtype}: {s.lower_calls}/{s.calls} op calls ({s.lower_call_share:.0%}) and "
               f"{s.lower_flop_share:.0%} of matmul/conv FLOPs in {s.dtype}; {s.casts} casts inserted; "
               f"output error {fmt_err(s.output_error)}")
    out = console()
    legend = rule_legend(r.rule for r in shown)
    if is_tty():
        title = f"mpt inspect: {user.path.name}" + (f", {TOP_TITLE.format(n=len(shown))}" if top else "")
        styles = ["red" if r.nonfinite else ("cyan" if r.dtype in ("bf16", "fp16") else None) for r in shown]
        out.print(rich_table(_TERMINAL_COLUMNS, [_terminal_row(r) for r in shown], _STAGES, out.width,
                             title=title, styles=styles))
        out.print(legend)
    else:
        if top:
            out.print(TOP_TITLE.format(n=len(shown)))
        for line in plain_table(_PLAIN_COLUMNS, [_plain_row(r) for r in shown], _STAGES, PIPED_WIDTH):
            out.print(line)
        for line in wrap_line(legend):
            out.print(line)
    out.print(summary)
    if s.first_nonfinite:
        out.print(f"first non-finite output (NaN/inf) at {s.first_nonfinite}")

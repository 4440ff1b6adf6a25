"""`mpt inspect` tables fit 120 columns on a terminal and piped, stay aligned, and `--top` skips neutral ops."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from rich.console import Console

import mpt_cli.inspect_cmd
import mpt_cli.render
from mpt_cli.main import main
from mpt_cli.tables import (PIPED_WIDTH, RULE_ABBREV, Column, Shorten, fit_widths, plain_table, rule_legend,
                        shorten_middle)
from tuner.policy.opnames import DROPOUT_OPS, NEUTRAL_OPS
from tuner.policy.rules import Rule

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TRANSFORMER = str(EXAMPLES / "digits_transformer.py")
WIDTH = 120

# A transformer-like model whose module paths run to ~95 characters: nested ModuleDict/Sequential, with
# the reshape/permute/transpose/contiguous/dropout calls attention code makes.
DEEP = '''
import torch
from torch import nn


class Deep(nn.Module):
    def __init__(self):
        super().__init__()
        layer = lambda: nn.ModuleDict({
            "multi_head_self_attention": nn.ModuleDict({"query_key_value_projection": nn.Linear(16, 48)}),
            "feed_forward_network": nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Dropout(0.1),
                                                  nn.Linear(32, 16)),
        })
        self.backbone_encoder_stack = nn.ModuleDict(
            {"transformer_layers": nn.Sequential(*[layer() for _ in range(12)])})

    def forward(self, x):
        for block in self.backbone_encoder_stack["transformer_layers"]:
            qkv = block["multi_head_self_attention"]["query_key_value_projection"](x)
            q, k, v = qkv.reshape(2, 5, 3, 16).permute(2, 0, 1, 3).unbind(0)
            att = torch.softmax(q @ k.transpose(-2, -1) / 4.0, dim=-1) @ v
            x = x + att.contiguous().view(2, 5, 16)
            x = x + block["feed_forward_network"](x)
        return x


def build_model():
    torch.manual_seed(0)
    return Deep()


def example_inputs():
    torch.manual_seed(1)
    return (torch.randn(2, 5, 16),)
'''


@pytest.fixture
def deep(tmp_path) -> str:
    path = tmp_path / "deep_model.py"
    path.write_text(DEEP)
    return str(path)


@pytest.fixture
def transformer() -> str:
    pytest.importorskip("sklearn")  # example_inputs() reads the digits test split
    return TRANSFORMER


def _terminal(monkeypatch, how: str) -> None:
    """Make `mpt inspect` draw its rich table as on a 120-column terminal."""
    monkeypatch.setattr(mpt_cli.render, "is_tty", lambda: True)
    monkeypatch.setattr(mpt_cli.inspect_cmd, "is_tty", lambda: True)
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    if how == "console":
        monkeypatch.setattr(mpt_cli.inspect_cmd, "console",
                            lambda: Console(file=sys.stdout, width=WIDTH, highlight=False, color_system=None))


def _records(runner, model: str, *args: str) -> list[dict]:
    res = runner.invoke(main, ["inspect", model, "--dtype", "bf16", "--json", *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)["records"]


def _inspect(runner, model: str, *args: str) -> list[str]:
    res = runner.invoke(main, ["inspect", model, "--dtype", "bf16", *args])
    assert res.exit_code == 0, res.output
    return res.stdout.splitlines()


def _body(lines: list[str]) -> list[str]:
    """The rich table's data rows."""
    start = next(n for n, line in enumerate(lines) if line.startswith("┡"))
    end = next(n for n, line in enumerate(lines) if line.startswith("└"))
    return lines[start + 1:end]


def _plain(lines: list[str]) -> list[str]:
    """The piped table: its header line and rows, up to the legend."""
    start = next(n for n, line in enumerate(lines) if line.startswith("module "))
    end = next(n for n, line in enumerate(lines) if line.startswith("rule: "))
    return lines[start:end]


@pytest.mark.parametrize("how", ["columns", "console"])
@pytest.mark.parametrize("model", ["transformer", "deep"])
def test_terminal_table_fits_120_columns_one_line_per_call(runner, monkeypatch, request, model, how):
    path = request.getfixturevalue(model)
    records = _records(runner, path)
    _terminal(monkeypatch, how)
    lines = _inspect(runner, path)
    assert max(len(line) for line in lines) <= WIDTH
    body = _body(lines)
    assert len(body) == len(records)  # no cell wrapped onto a second line
    for line, r in zip(body, records):
        cells = [c.strip() for c in line.strip("│").split("│")]
        assert cells[1] == f"{r['op']}#{r['index']}"
        assert cells[-1] == RULE_ABBREV[Rule(r["rule"])]
    legend = next(line for line in lines if line.startswith("rule: "))
    assert "pass = unlisted: passthrough" in legend and "lower = lower list" in legend


def test_terminal_table_shortens_long_paths_in_the_middle(runner, monkeypatch, deep):
    records = _records(runner, deep)
    _terminal(monkeypatch, "console")
    body = _body(_inspect(runner, deep))
    shortened = 0
    for line, r in zip(body, records):
        cell = line.strip("│").split("│")[0].strip()
        if cell == (r["module"] or "(root)"):
            continue
        shortened += 1
        head, tail = cell.split("…")
        assert len(head) >= 8 and len(tail) >= 8 and len(cell) < len(r["module"])
        assert r["module"].startswith(head) and r["module"].endswith(tail)
    assert shortened >= sum(len(r["module"]) > 70 for r in records) > 0


@pytest.mark.parametrize("model", ["transformer", "deep"])
def test_piped_table_is_aligned_and_within_120_characters(runner, request, model):
    path = request.getfixturevalue(model)
    lines = _inspect(runner, path)
    if model == "transformer":  # paths of ordinary length: within 120 (deep's paths are kept whole, below)
        assert all(len(line) <= PIPED_WIDTH for line in lines[:-1])  # the summary line is prose
    table = _plain(lines)
    assert len(table) == len(_records(runner, path)) + 1
    header = table[0]
    starts = [header.index(word) for word in ("op", "inputs", "computed", "output", "rule")]
    ends = [header.index(word) + len(word) for word in ("error", "local")]
    for line in table:
        assert len(line) - len(line.split()[-1]) == starts[-1]  # the rule column starts at the same offset
        for c in starts:
            assert line[c - 2:c] == "  " and line[c] != " ", (c, line)
        for e in ends:
            assert line[e - 1] != " " and line[e:e + 2] == "  ", (e, line)


def test_piped_table_keeps_whole_module_paths_to_paste_into_module(runner, deep):
    """Piped (a script, `| grep`), a module path is never cut: each row's first cell is a real path."""
    modules = {r["module"] for r in _records(runner, deep)}
    table = _plain(_inspect(runner, deep))
    cells = {line.split()[0] for line in table[1:]}
    assert cells <= modules | {"(root)"} and not any("..." in c for c in cells)
    assert max(len(m) for m in modules) > 70  # long enough to have been cut before


@pytest.mark.parametrize("model", ["transformer", "deep"])
def test_top_leaves_out_neutral_ops_and_ranks_by_local_error(runner, request, monkeypatch, model):
    path = request.getfixturevalue(model)
    full = _records(runner, path)
    neutral = [r for r in full if r["neutral"]]
    assert {r["op"] for r in neutral} >= {"permute" if model == "deep" else "transpose", "contiguous", "dropout"}
    assert all(r["op"] in NEUTRAL_OPS | DROPOUT_OPS for r in neutral)
    top = _records(runner, path, "--top", "20")
    assert len(top) == 20 and not any(r["neutral"] for r in top)
    assert not any(r["op"] in NEUTRAL_OPS | DROPOUT_OPS for r in top)
    locals_ = [r["local_error"] for r in top]
    assert locals_ == sorted(locals_, reverse=True)
    if model == "transformer":  # not vacuous: ranked with them, neutral calls (their `local` is the rounding
        assert max(r["local_error"] or 0 for r in neutral) > locals_[-1]  # of their input) would get in
    candidates = sorted((r["local_error"] for r in full if not r["neutral"] and r["local_error"] is not None),
                        reverse=True)
    assert locals_ == candidates[:20]

    ops = {f"{r['op']}#{r['index']}" for r in top}
    table = _plain(_inspect(runner, path, "--top", "10"))
    assert len(table) == 11 and {line.split()[1] for line in table[1:]} <= ops
    _terminal(monkeypatch, "console")
    lines = _inspect(runner, path, "--top", "10")
    assert max(len(line) for line in lines) <= WIDTH
    assert "left out" in "\n".join(lines) and len(_body(lines)) == 10


def test_shorten_middle_keeps_head_and_tail():
    path = "encoder.layer.13.attention.self"
    assert shorten_middle(path, 40) == path
    short = shorten_middle(path, 20)
    assert len(short) == 20 and short == "en…13.attention.self"  # the index and what follows it, whole
    assert shorten_middle(path, 20, "...") == "...13.attention.self"
    assert shorten_middle(path, 12) == "enc…ion.self"  # no room for the tail: it gets two thirds
    assert shorten_middle("layers.3.mlp.0", 10) == "la…3.mlp.0"  # a trailing Sequential index is not the index
    assert shorten_middle(path, 1) == "e"


def test_fit_widths_narrows_in_stage_order_and_never_below_a_floor():
    assert fit_widths([40, 30, 10], 100, [(0, 16)]) == [40, 30, 10]
    assert fit_widths([40, 30, 10], 60, [(0, 16), (1, 16)]) == [20, 30, 10]
    assert fit_widths([40, 30, 10], 40, [(0, 16), (1, 16), (0, 8)]) == [14, 16, 10]
    assert fit_widths([40, 30, 10], 10, [(0, 16), (1, 16)]) == [16, 16, 10]  # what no stage can take stays


def test_plain_table_pads_all_but_the_last_column():
    cols = [Column("module", shorten=Shorten.MIDDLE), Column("error", right=True), Column("rule")]
    lines = plain_table(cols, [["a.b.c", "1.0e-03", "lower"], ["x" * 50, "nan", "pass"]], [(0, 10)], width=26)
    assert lines == ["module        error  rule",
                     "a.b.c       1.0e-03  lower",
                     "xx...xxxxx      nan  pass"]


def test_every_rule_has_a_short_unique_name_and_a_legend():
    assert set(RULE_ABBREV) == set(Rule)
    assert len(set(RULE_ABBREV.values())) == len(Rule) and max(map(len, RULE_ABBREV.values())) <= 8
    assert rule_legend([Rule.PASSTHROUGH, Rule.LOWER, Rule.LOWER]) == \
        "rule: lower = lower list; pass = unlisted: passthrough"


# --- rows you can tell apart, at 80 and 120 columns -----------------------------------------------------------------

LAYERS = '''
import torch
from torch import nn


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = nn.Linear(8, 8)

    def forward(self, x):
        return self.self_attn(x) + x  # bf16 + fp32: torch promotes, the add runs in fp32


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList([Layer() for _ in range(3)])

    def forward(self, x):
        for layer in self.encoder.layers:
            x = layer(x)
        return x


def build_model():
    torch.manual_seed(0)
    return Model()


def example_inputs():
    torch.manual_seed(1)
    return (torch.randn(2, 8),)
'''


@pytest.fixture
def layers(tmp_path) -> str:
    path = tmp_path / "layers_model.py"
    path.write_text(LAYERS)
    return str(path)


@pytest.mark.parametrize("width", [80, 120])
def test_rows_that_differ_by_the_layer_index_stay_apart(runner, monkeypatch, layers, width):
    monkeypatch.setattr(mpt_cli.render, "is_tty", lambda: True)
    monkeypatch.setattr(mpt_cli.inspect_cmd, "is_tty", lambda: True)
    monkeypatch.setattr(mpt_cli.inspect_cmd, "console",
                        lambda: Console(file=sys.stdout, width=width, highlight=False, color_system=None))
    lines = _inspect(runner, layers)
    assert max(len(line) for line in lines) <= width
    cells = [[c.strip() for c in line.strip("│").split("│")] for line in _body(lines)]
    linears = [c[0] for c in cells if c[1] == "linear#0"]
    assert len(linears) == 3 and len(set(linears)) == 3  # three rows, told apart
    for n, cell in enumerate(linears):
        assert cell.endswith(f"{n}.self_attn"), cell
    if width == 80:  # the table is too wide for 80: the path is shortened, keeping the index
        assert all("…" in cell for cell in linears)


def test_a_promoted_add_says_the_dtype_it_ran_in(runner, layers):
    adds = [r for r in _records(runner, layers) if r["op"] == "add"]
    assert len(adds) == 3
    first = adds[0]  # bf16 (the linear's output) + fp32 (the model's input): torch ran it in fp32
    assert first["input_dtypes"] == ["bf16", "fp32"] and first["output_dtype"] == "fp32"
    assert first["dtype"] == "fp32" and first["rule"] == Rule.PASSTHROUGH.value
    assert first["local_error"] == 0.0  # replayed in fp32 on the FP32 run's inputs: it adds nothing itself
    table = _plain(_inspect(runner, layers))
    row = next(line.split() for line in table if line.split()[1] == "add#0")
    assert row[2:5] == ["bf16,fp32", "fp32", "fp32"]
    summary = _inspect(runner, layers)[-1]
    assert summary.startswith("torch-cpu bf16: 3/6 op calls (50%)")  # the adds are not counted as bf16

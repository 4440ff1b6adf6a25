"""Tables that fit: column widths from the content and the room there is, long cells shortened, not wrapped.

A `Column` says how its cells may be shortened (`MIDDLE` keeps a module path's
head and tail, `END` keeps its start) and how narrow it may get. `fit_widths`
takes the widths the content wants and narrows the shrinkable columns, in the
order given, until the table fits; `plain_table` lays rows out as aligned
lines for pipes and files, `rich_table` builds a rich Table for a terminal
with every cell on one line. Also here: the short rule names `mpt inspect`
shows and the legend line that spells them out.
"""
from __future__ import annotations

import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from tuner.policy.rules import Rule

PIPED_WIDTH = 120  # a table that is not on a terminal keeps its lines within this many characters
ELLIPSIS = "…"  # on a terminal
PLAIN_ELLIPSIS = "..."  # in piped output: ASCII, so byte and character offsets agree (cut -c, awk)


class Shorten(Enum):
    NEVER = "never"
    MIDDLE = "middle"  # `encoder.layer.…3.attention.self`: a path's head and tail say most
    END = "end"


@dataclass(frozen=True)
class Column:
    header: str
    right: bool = False  # right-justified (numbers)
    shorten: Shorten = Shorten.NEVER


# Short names for the rule column; the legend under the table spells out the ones shown.
RULE_ABBREV: dict[Rule, str] = {
    Rule.LOWER: "lower",
    Rule.FP32: "fp32",
    Rule.PROMOTE: "promote",
    Rule.BANNED: "banned",
    Rule.PASSTHROUGH: "pass",
    Rule.FIRST_INPUT: "first",
    Rule.UNLISTED_FP32: "unl-fp32",
    Rule.INPLACE: "in-place",
    Rule.INPLACE_FIRST_INPUT: "inpl-1st",
    Rule.OUT: "out=",
    Rule.OUT_FIRST_INPUT: "out=-1st",
    Rule.EXPLICIT_DTYPE: "dtype=",
    Rule.MODULE: "module",
    Rule.INSTANCE: "instance",
    Rule.FLOAT64: "float64",
    Rule.OTHER_DEVICE: "device",
    Rule.NO_FLOAT: "no-float",
    Rule.MODEL_FP32: "model",
    Rule.MODEL_AUTOCAST: "model-ac",
}


def rule_abbrev(rule: Rule) -> str:
    return RULE_ABBREV[rule]


def rule_legend(rules: Iterable[Rule]) -> str:
    """`rule: lower = lower list; pass = unlisted: passthrough` for the rules given, in the enum's order."""
    used = set(rules)
    return "rule: " + "; ".join(f"{RULE_ABBREV[r]} = {r.text}" for r in Rule if r in used)


def shorten_middle(text: str, width: int, ellipsis: str = ELLIPSIS) -> str:
    """`text` within `width` characters, its middle replaced by `ellipsis`.

    A module path keeps its last components from the nearest layer index on
    whole (`encoder.layers.3.self_attn` -> `enc…3.self_attn`, never
    `encod….self_attn`, so rows that differ only by the index stay apart),
    and its head gets the rest of the room. When even that tail does not fit,
    or the text has no such tail, the tail keeps two thirds of the room.
    """
    if len(text) <= width:
        return text
    if width <= len(ellipsis):
        return text[:width]
    tail = _path_tail(text)
    room = width - len(ellipsis) - len(tail)
    if tail and room >= 0:
        return text[:room] + ellipsis + tail
    room = width - len(ellipsis)
    tail_room = room - room // 3
    return text[:room - tail_room] + ellipsis + text[len(text) - tail_room:]


def _path_tail(text: str) -> str:
    """A dotted path's components from the layer index nearest its last named component on
    (`layers.3.mlp.0` -> `3.mlp.0`); from its last named component when no index comes before it; '' when
    it is not a dotted path."""
    parts = text.split(".")
    if len(parts) < 2:
        return ""
    named = max((n for n, p in enumerate(parts) if not p.isdigit()), default=len(parts) - 1)
    start = max((n for n, p in enumerate(parts[:named]) if p.isdigit()), default=named)
    return ".".join(parts[start:])


def shorten_end(text: str, width: int, ellipsis: str = ELLIPSIS) -> str:
    if len(text) <= width:
        return text
    if width <= len(ellipsis):
        return text[:width]
    return text[:width - len(ellipsis)] + ellipsis


def shorten(text: str, width: int, how: Shorten, ellipsis: str = ELLIPSIS) -> str:
    if how is Shorten.MIDDLE:
        return shorten_middle(text, width, ellipsis)
    if how is Shorten.END:
        return shorten_end(text, width, ellipsis)
    return text


def fit_widths(natural: Sequence[int], budget: int, stages: Sequence[tuple[int, int]]) -> list[int]:
    """Column widths whose sum is within `budget` where the stages allow it.

    `stages` are (column index, narrowest width) steps, tried in order: each
    narrows its column only as far as the table still needs and never below
    that width, nor below what it was. What no stage can take off stays over.
    """
    widths = list(natural)
    for col, floor in stages:
        excess = sum(widths) - budget
        if excess <= 0:
            break
        widths[col] -= min(excess, max(0, widths[col] - floor))
    return widths


def _natural(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> list[int]:
    return [max([len(c.header), *(len(row[i]) for row in rows)]) for i, c in enumerate(columns)]


def _cells(columns: Sequence[Column], row: Sequence[str], widths: Sequence[int], ellipsis: str) -> list[str]:
    return [shorten(cell, w, c.shorten, ellipsis) for c, cell, w in zip(columns, row, widths, strict=False)]


def plain_table(columns: Sequence[Column], rows: Sequence[Sequence[str]], stages: Sequence[tuple[int, int]],
                width: int = PIPED_WIDTH, gap: int = 2) -> list[str]:
    """The header and rows as aligned lines: each column as wide as its widest cell (after fitting the
    table into `width`), `gap` spaces between columns; the last column is not padded."""
    widths = fit_widths(_natural(columns, rows), width - gap * (len(columns) - 1), stages)

    def line(cells: Sequence[str]) -> str:
        parts = [cell.rjust(w) if c.right else cell.ljust(w)
                 for c, cell, w in zip(columns, cells, widths, strict=False)]
        return (" " * gap).join(parts).rstrip()

    header = line([c.header for c in columns])
    return [header, *(line(_cells(columns, row, widths, PLAIN_ELLIPSIS)) for row in rows)]


def rich_table(columns: Sequence[Column], rows: Sequence[Sequence[str]], stages: Sequence[tuple[int, int]],
               width: int, title: str | None = None, styles: Sequence[str | None] | None = None) -> Any:
    """A rich Table within `width` columns (default box, no edge padding), no cell wrapped: cells are
    shortened to the fitted widths here, and rich's ellipsis is the safety net."""
    from rich.table import Table

    # The default box with pad_edge=False: 2 edges, a rule between columns and a space each side of one.
    overhead = 3 * len(columns) - 1
    widths = fit_widths(_natural(columns, rows), width - overhead, stages)
    table = Table(title=title, show_lines=False, pad_edge=False)
    for c, w in zip(columns, widths, strict=False):
        table.add_column(c.header, justify="right" if c.right else "left", no_wrap=True, overflow="ellipsis",
                         max_width=w)
    for n, row in enumerate(rows):
        table.add_row(*_cells(columns, row, widths, ELLIPSIS), style=styles[n] if styles else None)
    return table


def wrap_line(text: str, width: int = PIPED_WIDTH, indent: str = "  ") -> list[str]:
    """A long line (a legend) as lines within `width`, the later ones indented."""
    return textwrap.wrap(text, width, subsequent_indent=indent, break_on_hyphens=False) or [""]

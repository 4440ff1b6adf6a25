"""Output helpers: rich on a terminal, plain lines otherwise; errors on stderr."""
from __future__ import annotations

import os
import sys

from rich.console import Console
from rich.text import Text


def is_tty() -> bool:
    return sys.stdout.isatty() and os.environ.get("TERM") != "dumb"


def console() -> Console:
    # Built per call so click's CliRunner (which swaps sys.stdout) captures the output.
    return Console(file=sys.stdout, highlight=False, soft_wrap=not is_tty())


def hanging(out: Console, head: Text, body: Text, *, min_width: int = 24) -> Text:
    """`head`, then `body` wrapped in the column right of it: a long trial label breaks between words and its
    next lines start under its first, where the terminal would break it mid-word and go on at column 0 (a word
    wider than the column is folded). Where the column would be narrower than `min_width`, the two as one text.
    """
    width = out.width - head.cell_len
    if width < min_width:
        return Text.assemble(head, body)
    lines = body.wrap(out, width, overflow="fold")
    text = head.copy()
    for i, line in enumerate(lines):
        line.rstrip()
        text.append_text(Text("\n" + " " * head.cell_len) + line if i else line)
    return text


def err(message: str) -> None:
    print(f"mpt: error: {message}", file=sys.stderr, flush=True)


def warn(message: str) -> None:
    print(f"mpt: warning: {message}", file=sys.stderr, flush=True)  # in order with stdout, on any stream


def fmt_err(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "-"
    if value != value:
        return "nan"
    if value == float("inf"):
        return "inf"
    return f"{value:.{digits}e}"

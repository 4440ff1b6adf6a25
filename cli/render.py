"""Output helpers: rich on a terminal, plain lines otherwise; errors on stderr."""
from __future__ import annotations

import os
import sys

from rich.console import Console


def is_tty() -> bool:
    return sys.stdout.isatty() and os.environ.get("TERM") != "dumb"


def console() -> Console:
    # Built per call so click's CliRunner (which swaps sys.stdout) captures the output.
    return Console(file=sys.stdout, highlight=False, soft_wrap=not is_tty())


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

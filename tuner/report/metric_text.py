"""How every output writes a metric, so the terminal, report.md, search.html and report.json's readers agree."""
from __future__ import annotations


def fmt_metric(value: float | None) -> str:
    """A metric as every output writes it: 4 significant digits (`0.9852`), `-` for none."""
    return "-" if value is None else f"{value:.4g}"

"""What a trial changed from the trial before it, in words: `+3 FP32: layer3.*.conv2:conv2d#0 ×3; -1: fc:linear#0`.

The search (tuner.search.strategy) picks sets; this module only compares the FP32 sets of two consecutive
trials, so every renderer (terminal, report.md, search.html) says what a trial tried without knowing how
the search chose it. Sibling paths that differ only in their indices (`layer1.0.conv1`, `layer1.1.conv1`)
are written once with `*` for the indices.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_INDEX = re.compile(r"(?<![^.])\d+(?=[.:])")  # a path component that is only digits (a ModuleList index)
SHOWN = 3  # groups written out before "..."


def compress(labels: Iterable[str]) -> list[str]:
    """Instance labels grouped by their path with indices as `*`: the biggest group first; `×N` for a group."""
    groups: dict[str, list[str]] = {}
    for label in labels:
        groups.setdefault(_INDEX.sub("*", label), []).append(label)
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    return [members[0] if len(members) == 1 else f"{pattern} ×{len(members)}" for pattern, members in ordered]


def _listed(labels: tuple[str, ...]) -> str:
    groups = compress(labels)
    return ", ".join(groups[:SHOWN]) + (" ..." if len(groups) > SHOWN else "")


@dataclass(frozen=True)
class Change:
    """The instances a trial keeps FP32 that the trial before it did not (`added`) and those it lowers again
    (`removed`); `kept` is how many FP32 instances the trial's plan records once the overrides that change
    nothing are dropped (None: not known), `total` how many it keeps FP32 as tried."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    total: int
    kept: int | None = None

    def __post_init__(self) -> None:
        if self.kept is not None and not 0 <= self.kept <= self.total:
            raise ValueError(f"kept must be within 0..{self.total}, found {self.kept}")

    @classmethod
    def between(cls, before: Iterable[str] | None, after: Iterable[str], kept: int | None = None) -> Change:
        """From the FP32 labels of the previous trial (None: there is none) to this one's."""
        old, new = set(before or ()), set(after)
        return cls(tuple(sorted(new - old)), tuple(sorted(old - new)), len(new), kept)

    def text(self, dtype: str) -> str:
        """`+3 FP32: a.*.b ×3; -1: c; 21 FP32` -- or `all eligible in bf16` for an empty set."""
        if not self.total:
            head = f"all eligible in {dtype}"
            return head if not self.removed else f"-{len(self.removed)}: {head}"
        parts = []
        if self.added:
            parts.append(f"+{len(self.added)} FP32: {_listed(self.added)}")
        if self.removed:
            parts.append(f"-{len(self.removed)}: {_listed(self.removed)}")
        parts.append(self.count_text())
        return "; ".join(parts)

    def count_text(self) -> str:
        """How many instances are FP32 as the plan records them: `21 FP32 (34 tried, 13 change nothing)`."""
        if self.kept is None or self.kept == self.total:
            return f"{self.total} FP32"
        return f"{self.kept} FP32 ({self.total} tried, {self.total - self.kept} change nothing)"

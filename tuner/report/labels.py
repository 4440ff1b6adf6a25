"""Where search.html's plot writes each trial number: beside its dot, never over another number.

Trials often land on almost the same spot (a pass at the baseline's metric, a share a few FLOPs apart), so
the labels are placed one by one: the first of a few spots around the dot whose box meets no label placed
before and stays inside the plot; dots at the same pixel share one label ("4,5,6").
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

CHAR_W, LINE_H = 6.6, 12.0  # an 11px sans-serif digit or comma is at most this wide; a line this tall

# (dx, dy, anchor) from the dot to the text's baseline point, nearest first
_SPOTS = [(9, -8, "start"), (-9, -8, "end"), (9, 14, "start"), (-9, 14, "end"), (0, -11, "middle"),
          (0, 20, "middle")]


@dataclass(frozen=True)
class PlacedLabel:
    text: str
    x: float
    y: float
    anchor: str  # SVG text-anchor: start, middle, end

    def box(self) -> tuple[float, float, float, float]:
        """(x0, y0, x1, y1) the text covers."""
        width = CHAR_W * len(self.text)
        x0 = {"start": self.x, "middle": self.x - width / 2, "end": self.x - width}[self.anchor]
        return x0, self.y - LINE_H + 2, x0 + width, self.y + 2


def overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _text(ns: Sequence[int]) -> str:
    return ",".join(map(str, ns)) if len(ns) <= 4 else f"{ns[0]}-{ns[-1]}"


def place_labels(points: Mapping[tuple[int, int], Sequence[int]],
                 area: tuple[float, float, float, float]) -> list[PlacedLabel]:
    """A label for each pixel position holding trial numbers, none overlapping another (within `area`:
    x0, y0, x1, y1). Spots further out are tried when the near ones are taken."""
    placed: list[PlacedLabel] = []
    for (cx, cy), ns in sorted(points.items(), key=lambda kv: kv[1][0]):
        text = _text(ns)
        label = None
        for ring in range(8):
            for dx, dy, anchor in _SPOTS:
                lift = ring * LINE_H * (1 if dy > 0 else -1)
                cand = PlacedLabel(text, cx + dx, cy + dy + lift, anchor)
                x0, y0, x1, y1 = cand.box()
                inside = x0 >= area[0] and x1 <= area[2] and y0 >= area[1] and y1 <= area[3]
                if inside and not any(overlap(cand.box(), p.box()) for p in placed):
                    label = cand
                    break
            if label is not None:
                break
        placed.append(label or PlacedLabel(text, cx + 9, cy - 8, "start"))
    return placed

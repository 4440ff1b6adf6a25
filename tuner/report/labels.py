"""Where search.html's plot writes each trial number: beside its dot, never over another number or a marker.

Trials often land on almost the same spot (a pass at the baseline's metric, a share a few FLOPs apart), so
the labels are placed one by one: the first of a few spots around the dot, then of spots further out, nearest
first, whose box meets no label placed before and no marker (every dot, the chosen plan's diamond, the target's
text) and stays inside the plot; dots at the same pixel share one label ("4,5,6").
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

# an 11px sans-serif digit is at most this wide (DejaVu Sans, the usual Linux fallback: 0.636 em); a line this tall
CHAR_W, LINE_H = 7.0, 12.0
MARKER_R = 5.0  # the plot's dots: circles of this radius

Box = tuple[float, float, float, float]  # x0, y0, x1, y1

# (dx, dy, anchor) from the dot to the text's baseline point, nearest first
_SPOTS = [(9, -8, "start"), (-9, -8, "end"), (9, 14, "start"), (-9, 14, "end"), (0, -11, "middle"),
          (0, 20, "middle")]
_REACH, _STEP = 90, 3  # spots further out: text centres on this grid of pixels around the dot, nearest first
_GRID = sorted(((dx, dy) for dx in range(-_REACH, _REACH + 1, _STEP) for dy in range(-_REACH, _REACH + 1, _STEP)),
               key=lambda d: (d[0] ** 2 + d[1] ** 2, d))


@dataclass(frozen=True)
class PlacedLabel:
    text: str
    x: float
    y: float
    anchor: str  # SVG text-anchor: start, middle, end

    def box(self) -> Box:
        """(x0, y0, x1, y1) the text covers."""
        width = CHAR_W * len(self.text)
        x0 = {"start": self.x, "middle": self.x - width / 2, "end": self.x - width}[self.anchor]
        return x0, self.y - LINE_H + 2, x0 + width, self.y + 2


def overlap(a: Box, b: Box) -> bool:
    """Whether two boxes share any area (touching edges do not count)."""
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def marker_box(cx: float, cy: float, r: float = MARKER_R) -> Box:
    """The box around a marker of radius `r` centred on (cx, cy)."""
    return cx - r, cy - r, cx + r, cy + r


def _text(ns: Sequence[int]) -> str:
    return ",".join(map(str, ns)) if len(ns) <= 4 else f"{ns[0]}-{ns[-1]}"


def _candidates(text: str, cx: float, cy: float) -> Iterator[PlacedLabel]:
    """Where a label may go, nearest to its dot first: the usual spots, lifted line by line, then a grid."""
    for ring in range(3):
        for dx, dy, anchor in _SPOTS:
            yield PlacedLabel(text, cx + dx, cy + dy + ring * LINE_H * (1 if dy > 0 else -1), anchor)
    for dx, dy in _GRID:  # (dx, dy): the text's centre; its baseline sits 4 px below that
        yield PlacedLabel(text, cx + dx, cy + dy + LINE_H / 2 - 2, "middle")


def place_labels(points: Mapping[tuple[int, int], Sequence[int]], area: Box,
                 obstacles: Iterable[Box] = ()) -> list[PlacedLabel]:
    """A label for each pixel position holding trial numbers, inside `area` (x0, y0, x1, y1), covering no
    other label, no dot (a circle of MARKER_R at each position) and none of `obstacles` (other markers)."""
    blocked = [marker_box(cx, cy) for cx, cy in points] + list(obstacles)
    placed: list[PlacedLabel] = []
    for (cx, cy), ns in sorted(points.items(), key=lambda kv: kv[1][0]):
        text = _text(ns)
        label = next((c for c in _candidates(text, cx, cy) if _free(c.box(), area, blocked)), None)
        label = label or PlacedLabel(text, cx + 9, cy - 8, "start")  # nowhere free: beside the dot all the same
        placed.append(label)
        blocked.append(label.box())
    return placed


def _free(box: Box, area: Box, blocked: list[Box]) -> bool:
    inside = box[0] >= area[0] and box[2] <= area[2] and box[1] >= area[1] and box[3] <= area[3]
    return inside and not any(overlap(box, b) for b in blocked)

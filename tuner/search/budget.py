"""How much the search's cheap aids may cost: the ranking's backward probes and the guide's forwards.

Both run the model on the example inputs, never `evaluate`. On a small model (a forward under 10 GFLOP:
tens of milliseconds) the aids run in full and take seconds, so a small model is searched the same way on any
machine. On a large one a forward is a share of an evaluation (a 1.1B LM scored on 33 batches: one evaluate is
worth 33 forwards), and the aids in full would cost more than the evaluations they spare: at 1.1B the
ranking's 8 probes and the guide's 16 forwards were a third of the tune (issue 20 asks mpt's own time under
15%). There each aid gets a fixed share of one evaluation: `aid_limits`. The share is sized from counts
(FLOPs, the tensor elements evaluate fed the model), not seconds, so a rerun of the same command takes the
same path.

Why not smaller: the guide pays for itself at 1.1B (`benchmarks/scale.py --layers 22 --batches 33`, 8
prefixes: 8 evaluations, 89% of FLOPs in bf16). Halving its prefixes (4, 8 forwards) saved about 4 s of
forwards and cost one more evaluation (9, about 19 s) for the same plan; the least guide (2 prefixes) was
still at 84% after 7 evaluations, where the full one had passed 88% at its 5th.
"""
from __future__ import annotations

from dataclasses import dataclass

CHEAP_FORWARD_FLOPS = 1e10  # a forward of under 10 GFLOP: the aids in full take seconds, not worth limiting
MAX_PREFIXES, MAX_IMPROVE_UNITS, MAX_PROBES = 64, 16, 8  # the aids in full
MIN_PREFIXES, MIN_UNITS, MIN_PROBES = 4, 2, 4  # the least, however dear a forward is (2 probes misrank)
GUIDE_EVALS = 0.25  # the guide's prefixes cost about this share of an evaluate, and all its forwards twice that
RANK_EVALS = 1 / 16  # backward probes per forward an evaluate is worth (a probe costs ~2 forwards: ~1/8)


@dataclass(frozen=True)
class AidLimits:
    """`prefixes`: the ranking's prefixes the guide observes one by one; `units`: units it weighs per round
    of lowering back (one forward each); `probes`: the gradient ranking's backward passes; `forwards`: the
    guide's forwards in all (None: as many as the search asks for), after which the search goes on without it
    (`tuner.search.guide.GuideSpent`)."""

    prefixes: int
    units: int
    probes: int
    forwards: int | None = None

    def __post_init__(self) -> None:
        if self.prefixes < 2 or self.units < 1 or self.probes < 1:
            raise ValueError(f"aid limits must be positive (prefixes >= 2): {self}")
        if self.forwards is not None and self.forwards < self.prefixes:
            raise ValueError(f"aid limits: the guide's forwards must cover its prefixes: {self}")


FULL = AidLimits(MAX_PREFIXES, MAX_IMPROVE_UNITS, MAX_PROBES)


def aid_limits(forward_flops: float, evaluate_forwards: float) -> AidLimits:
    """The aids for a forward of `forward_flops` on the example inputs, one evaluate being worth
    `evaluate_forwards` such forwards: in full when a forward is cheap in FLOPs; else the prefixes GUIDE_EVALS
    of an evaluate buys (a quarter as many units per round, twice as many forwards in all) and RANK_EVALS
    probes per forward, each within its least and its full size. An evaluate worth 256 forwards or more
    affords the prefixes, units and probes in full."""
    if forward_flops <= CHEAP_FORWARD_FLOPS:
        return FULL
    prefixes = min(MAX_PREFIXES, max(MIN_PREFIXES, int(GUIDE_EVALS * evaluate_forwards)))
    return AidLimits(prefixes, min(MAX_IMPROVE_UNITS, max(MIN_UNITS, prefixes // 4)),
                     min(MAX_PROBES, max(MIN_PROBES, int(RANK_EVALS * evaluate_forwards))), 2 * prefixes)

"""What the search's cheap aids may spend: in full on a small model, a share of an evaluation on a large one."""
import pytest

from tuner.search import session as session_module
from tuner.search.budget import (
    CHEAP_FORWARD_FLOPS,
    FULL,
    GUIDE_EVALS,
    MAX_IMPROVE_UNITS,
    MAX_PREFIXES,
    MAX_PROBES,
    MIN_PREFIXES,
    MIN_PROBES,
    MIN_UNITS,
    AidLimits,
    aid_limits,
)
from tuner.search.results import EventKind
from tuner.search.session import tune
from tuner.testing import PlantedTask

LARGE = 1.4e11  # FLOPs of a 1.1B LM's forward on 64 tokens


def test_a_cheap_forward_gets_the_aids_in_full_however_short_the_evaluate():
    assert aid_limits(5e6, 1.0) == FULL == AidLimits(MAX_PREFIXES, MAX_IMPROVE_UNITS, MAX_PROBES)
    assert aid_limits(CHEAP_FORWARD_FLOPS, 0.5) == FULL
    assert aid_limits(4.8e9, 32.0) == FULL  # the zoo's LSTM LM: a forward of tens of ms, the aids take seconds


def test_a_dear_forward_gets_a_share_of_an_evaluation():
    at33 = aid_limits(LARGE, 33.0)  # the 1.1B LM scored on 33 batches (benchmarks/scale.py)
    assert at33 == AidLimits(8, MIN_UNITS, MIN_PROBES, 16) and MIN_PROBES >= 4  # 2 probes misrank (zoo lstm_lm)
    assert at33.prefixes - 1 <= GUIDE_EVALS * 33  # the prefixes past the all-low one: a quarter of an evaluate
    assert at33.forwards <= 2 * GUIDE_EVALS * 33  # and all the guide's forwards half of one
    assert aid_limits(LARGE, 2.0) == AidLimits(MIN_PREFIXES, MIN_UNITS, MIN_PROBES, 2 * MIN_PREFIXES)  # the least
    full = AidLimits(MAX_PREFIXES, MAX_IMPROVE_UNITS, MAX_PROBES, 2 * MAX_PREFIXES)
    assert aid_limits(LARGE, 256.0) == full  # an evaluate of 256 forwards affords the aids in full
    assert aid_limits(LARGE, 1e9) == full  # and never more
    sizes = [aid_limits(LARGE, float(e)) for e in range(1, 300)]
    for a, b in zip(sizes, sizes[1:]):  # a longer evaluate never buys less
        assert a.prefixes <= b.prefixes and a.units <= b.units and a.probes <= b.probes and a.forwards <= b.forwards


@pytest.mark.parametrize("bad", [dict(prefixes=1, units=1, probes=1), dict(prefixes=4, units=0, probes=2),
                                 dict(prefixes=4, units=2, probes=0), dict(prefixes=8, units=2, probes=4, forwards=7)])
def test_limits_that_leave_an_aid_nothing_are_refused(bad):
    with pytest.raises(ValueError, match="aid limits"):
        AidLimits(**bad)


@pytest.mark.plan
def test_the_session_gives_the_ranking_and_the_guide_the_limits(monkeypatch):
    """A tune whose forward is taken as dear ranks with the probes and guides with the forwards it is given,
    and still finds the planted pair."""
    given = AidLimits(4, 1, 3)
    seen = []

    def limits(flops, forwards):
        seen.append((flops, forwards))
        return given

    monkeypatch.setattr(session_module, "aid_limits", limits)
    task = PlantedTask(24, 2)
    events = []
    result = tune(task.build, task.evaluate, task.example_inputs, dtype="bf16", tolerance=0.01,
                  on_event=events.append)
    assert result.status == "ok"
    # exact on any CPU: tuner.testing.PlantedTask
    assert {i.label() for i in result.plan.fp32_instances} == task.build().fragile_labels()
    assert len(seen) == 1 and seen[0][0] > 0 and seen[0][1] >= 1  # evaluate: a forward at least
    ranked = [e.payload for e in events if e.kind is EventKind.RANK]
    assert ranked and ranked[-1].done == ranked[-1].total and ranked[-1].total % 3 == 0
    guided = [n for n in result.notes if "forwards on the example inputs guided" in n]
    assert not guided or int(guided[0].split()[0]) <= given.prefixes + 8

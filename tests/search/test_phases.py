"""The phase table: each phase's own seconds and the seconds inside evaluate, which add up to the tune's."""
import pytest

import tuner
from tuner.search.phases import Phase, PhaseClock
from tuner.testing import PlantedTask


def test_a_tune_times_each_phase_and_splits_evaluate_from_mpts_own_time():
    task = PlantedTask(8, 1, samples=128)
    result = tuner.tune(task.build, task.evaluate, task.example_inputs, tolerance=0.002, progress=False)
    table = result.phases.table()
    assert list(table) == [p.value for p in Phase if p.value in table]  # in the order the phases run
    assert {"baseline", "candidates", "all-low", "search", "result"} <= set(table)
    assert result.evals > 2 and table["search"]["evaluate"] > 0  # the search's trials are timed inside evaluate
    assert sum(row["evaluate"] for row in table.values()) == pytest.approx(result.eval_seconds, abs=1e-3)
    assert all(row["own"] >= 0 for row in table.values())
    assert sum(row["own"] + row["evaluate"] for row in table.values()) <= result.seconds


def test_a_phase_run_in_pieces_adds_up_and_evaluate_time_is_taken_out():
    inside = [0.0]
    clock = PhaseClock(lambda: inside[0])
    for _ in range(2):
        with clock.phase(Phase.SEARCH):
            inside[0] += 5.0  # five seconds "inside evaluate" that took no wall time: own time stays >= 0
    assert clock.evaluate[Phase.SEARCH] == 10.0 and clock.own[Phase.SEARCH] == 0.0

"""The result phase's recorded forward and the proof of the lowered weights share one loan of the model, so
the keeper reads every weight byte once after them, not twice (GPT-2 774M: 3 GB a pass, issue 44)."""
import tuner
from tuner.core.fingerprint import ModelState
from tuner.search.session import TuneSession
from tuner.testing import PlantedTask


def test_the_result_phase_reads_the_weights_once(monkeypatch):
    full = []
    inside = [False]
    capture, result = ModelState.capture.__func__, TuneSession.result

    def counted(cls, model, *, since=None, changed=()):
        if inside[0] and since is None:
            full.append(1)
        return capture(cls, model, since=since, changed=changed)

    def timed(self, *args, **kwargs):
        inside[0] = True
        try:
            return result(self, *args, **kwargs)
        finally:
            inside[0] = False

    monkeypatch.setattr(ModelState, "capture", classmethod(counted))
    monkeypatch.setattr(TuneSession, "result", timed)
    task = PlantedTask(8, 1, samples=128)
    res = tuner.tune(task.build, task.evaluate, task.example_inputs, tolerance=0.002, progress=False)
    assert res.chosen is not None and res.recorded is not None  # a plan was chosen, recorded and proven
    assert len(full) == 1

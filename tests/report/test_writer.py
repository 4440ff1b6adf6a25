"""Writing the outputs costs no extra model copy, the latency is measured honestly, and the shares come
from the one recorded forward that also finds the lowered parameters."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import tuner
import tuner.report.checkpoint as checkpoint
from tuner.engine.attach import attached
from mpt_cli.main import main
from tuner.measure.inspection import inspect_model
from tuner.report.checkpoint import load, plan_pass, save_checkpoint
from tuner.core.fingerprint import sha256_file
from tuner.core.inputs import ModelInputs
from tuner.core.loader import load_user_model
from tuner.report.latency import compare_latency
from tuner.report.measuring import measure_report
from tuner.report.writer import write_outputs
from tuner.policy.plan import OpInstance, Plan
from tuner.jobs.tune_run import tune_into_folder
from tuner.testing import PlantedTask
from tuner.options.tune import TuneOptions
from tuner.search.results import TuneResult, TuneStatus

COUNTED = str(Path(__file__).parents[1] / "assets" / "counted_model.py")


def _builds(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


# --- no extra copies --------------------------------------------------------------------------------------------

def test_tune_into_folder_builds_the_model_once(tmp_path, monkeypatch):
    counter = tmp_path / "builds.txt"
    monkeypatch.setenv("MPT_TEST_BUILDS", str(counter))
    run = tune_into_folder(load_user_model(COUNTED), TuneOptions(dtype="bf16"), tmp_path / "out")
    assert run.wrote_outputs and run.result.rebuilds == 0
    assert _builds(counter) == 1  # the keeper's model serves the search, the checkpoint and the timing
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    lat = report["latency_ms"]
    assert {"fp32", "tuned", "speedup", "fp32_spread", "tuned_spread", "rounds"} <= set(lat)
    assert lat["order"] == "interleaved" and lat["tuned_weights"] == "cast per call" and lat["rounds"] >= 3
    assert lat["fp32"] > 0 and lat["tuned"] > 0 and lat["fp32_spread"] >= 0


def test_no_latency_flag_gives_null_latency(runner, tmp_path, monkeypatch):
    counter = tmp_path / "builds.txt"
    monkeypatch.setenv("MPT_TEST_BUILDS", str(counter))
    out = tmp_path / "out"
    res = runner.invoke(main, ["tune", COUNTED, "--out", str(out), "--no-latency"])
    assert res.exit_code == 0, res.output
    report = json.loads((out / "report.json").read_text())
    assert report["latency_ms"] is None
    assert not any("ran slower than FP32" in w for w in report["warnings"])
    assert "target met" in res.output and "ms FP32" not in res.output
    assert _builds(counter) == 1
    # the flag is not a search setting: a resumed run may time again (the journal fingerprint is unchanged)
    res = runner.invoke(main, ["tune", COUNTED, "--out", str(out), "--resume"])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "report.json").read_text())["latency_ms"] is not None


def test_latency_false_in_a_config_file(runner, tmp_path):
    config = tmp_path / "mpt.yaml"
    config.write_text(f"version: 1\nmodel: {COUNTED}\nout: {tmp_path / 'out'}\nlatency: false\n")
    res = runner.invoke(main, ["tune", "--config", str(config)])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "out" / "report.json").read_text())["latency_ms"] is None


def _result(plan: Plan, inputs: tuple) -> TuneResult:
    return TuneResult(plan=plan, status=TuneStatus.MET, baseline=1.0, target=0.99, metric=1.0, trials=[], evals=3,
                      stopped=None, candidates=[], scores={}, inputs=inputs)


def test_write_outputs_takes_no_builder_and_can_skip_latency(tmp_path):
    task = PlantedTask(8, 1, samples=64)
    model = task.build()
    plan = Plan(dtype="bf16", preset="torch-cpu", fp32_instances=(OpInstance("branches.0", "linear", 0),))
    result = _result(plan, task.example_inputs())
    report = write_outputs(result, measure_report(result, model, latency=False), tmp_path, model=model)
    assert report.latency is None and report.checkpoint is not None and report.plan.checkpoint_sha256
    shares = inspect_model(model, task.example_inputs(), plan, local_errors=False).summary
    assert report.shares.call_share == shares.lower_call_share
    assert report.shares.flop_share == shares.lower_flop_share
    assert load(task.build(), tmp_path)(task.example_inputs()[0]).shape == (32, 8)


# --- honest latency ---------------------------------------------------------------------------------------------

def test_latency_rounds_alternate_fp32_and_tuned_on_the_same_model():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    plan = Plan(dtype="bf16", preset="torch-cpu", fp32_instances=(OpInstance("2", "linear", 0),))
    order: list[str] = []
    model.register_forward_pre_hook(lambda m, a: order.append("T" if "forward" in m.__dict__ else "F"))
    lat = compare_latency(model, plan, ModelInputs.of((torch.randn(4, 8),)), min_time=0.0, max_time=0.0,
                          min_rounds=4)
    assert order == ["F", "T"] * 5  # a warm-up of each, then interleaved rounds
    assert lat.rounds == 4 and lat.speedup == pytest.approx(lat.fp32 / lat.tuned)
    assert attached(model) is None and "forward" not in model.__dict__  # detached again


# --- the checkpoint: no full clone, tied weights ------------------------------------------------------------------

def test_checkpoint_writes_fp32_tensors_from_the_models_own_storage(tmp_path, monkeypatch):
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    plan = Plan(dtype="bf16", preset="torch-cpu", fp32_instances=(OpInstance("2", "linear", 0),))
    seen: dict[str, torch.Tensor] = {}
    real = checkpoint.write_safetensors
    monkeypatch.setattr(checkpoint, "write_safetensors",
                        lambda tensors, *a, **k: (seen.update(tensors), real(tensors, *a, **k))[1])
    save_checkpoint(model, plan, (torch.randn(2, 8),), tmp_path / "model.safetensors")
    assert seen["0.weight"].dtype == torch.bfloat16  # lowered: a new, smaller tensor
    assert seen["2.weight"].data_ptr() == model[2].weight.data_ptr()  # FP32: not copied
    assert seen["2.bias"].data_ptr() == model[2].bias.data_ptr()


class _Tied(nn.Module):
    """An embedding reused as the output layer (an LM head), plus two linears sharing one weight."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(12, 8)
        self.mix = nn.Linear(8, 8, bias=False)
        self.mix_again = nn.Linear(8, 8, bias=False)
        self.mix_again.weight = self.mix.weight
        self.out = nn.Linear(8, 12, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.mix_again(torch.relu(self.mix(self.embed(ids))))))


def test_tied_weights_round_trip_through_save_and_load(tmp_path, monkeypatch):
    torch.manual_seed(0)
    model = _Tied().eval()
    ids = torch.randint(0, 12, (3, 5))
    plan = Plan(dtype="bf16", preset="torch-cpu")
    lowered = plan_pass(model, plan, (ids,)).lowered
    assert set(lowered) == {"mix.weight", "mix_again.weight"}  # both names of the tied linear weight
    assert "embed.weight" not in lowered and "out.weight" not in lowered  # the embedding reads it in FP32
    with monkeypatch.context() as m:  # a tied weight is written from its own memory under each name: no copy
        m.setattr(torch.Tensor, "clone", lambda *a, **k: pytest.fail("a tied weight was copied"))
        info = save_checkpoint(model, plan, (ids,), tmp_path / "model.safetensors", lowered=lowered, check=True)
    assert info.lowered == 2
    Plan(dtype="bf16", preset="torch-cpu", checkpoint_sha256=sha256_file(tmp_path / "model.safetensors")) \
        .save(tmp_path / "plan.yaml")
    reference = _Tied().eval()
    reference.load_state_dict(model.state_dict())
    tuner.attach(reference, plan, engine="python")
    fresh = _Tied().eval()
    loaded = load(fresh, tmp_path)
    assert loaded.out.weight is loaded.embed.weight and loaded.mix_again.weight is loaded.mix.weight
    assert loaded.mix.weight.dtype == torch.bfloat16 and loaded.embed.weight.dtype == torch.float32
    with torch.no_grad():
        assert torch.equal(loaded(ids), reference(ids))


# --- the shares from the one recorded forward ----------------------------------------------------------------------

@pytest.mark.parametrize("fp32", [(), (("branches.0", "linear", 0), ("chain.1", "linear", 0))])
def test_shares_equal_inspect_models_summary(fp32):
    task = PlantedTask(8, 1, samples=64)
    model = task.build()
    plan = Plan(dtype="bf16", preset="torch-cpu", fp32_instances=tuple(OpInstance(*i) for i in fp32))
    shares = plan_pass(model, plan, task.example_inputs()).shares
    summary = inspect_model(model, task.example_inputs(), plan, local_errors=False).summary
    assert (shares.calls, shares.lower_calls, shares.flops, shares.lower_flops) == \
        (summary.calls, summary.lower_calls, summary.flops, summary.lower_flops)
    assert shares.call_share == summary.lower_call_share and shares.flop_share == summary.lower_flop_share
    assert 0 < shares.flop_share <= 1


# --- device-to-host transfers after the search ------------------------------------------------------------------

_LAYERED = '''
import torch
from torch import nn


def build_model():
    torch.manual_seed(0)
    blocks = []
    for _ in range({layers}):
        blocks += [nn.Linear(16, 16), nn.LayerNorm(16), nn.GELU()]
    return nn.Sequential(*blocks, nn.Linear(16, 4)).eval()


def example_inputs():
    return (torch.randn(8, 16, generator=torch.Generator().manual_seed(1)),)


def evaluate(model):
    with torch.no_grad():
        return 1.0 + 0.0 * float(model(*example_inputs()).mean())
'''
_TO_HOST = ("cpu", "item", "tolist", "__bool__", "__float__", "__int__")


def _report_phase_transfers(tmp_path: Path, monkeypatch, layers: int) -> dict[str, int]:
    """Calls that copy a tensor to the host (a sync on a GPU) while the report is measured and written, the
    checkpoint's tensors taken to the host as a GPU's are (`grouped`)."""
    import functools

    import tuner.jobs.tune_run as tune_run
    import tuner.report.writer as writer

    folder = tmp_path / f"layers{layers}"
    folder.mkdir()
    (folder / "m.py").write_text(_LAYERED.format(layers=layers))
    counts = {name: 0 for name in _TO_HOST}
    active = [False]

    def counting(name, real):
        def method(self, *args, **kwargs):
            counts[name] += active[0]
            return real(self, *args, **kwargs)
        return method

    def during(real):
        def phase(*args, **kwargs):
            active[0] = True
            try:
                return real(*args, **kwargs)
            finally:
                active[0] = False
        return phase

    with monkeypatch.context() as m:
        for name in _TO_HOST:
            m.setattr(torch.Tensor, name, counting(name, getattr(torch.Tensor, name)))
        m.setattr(tune_run, "measure_report", during(tune_run.measure_report))
        m.setattr(tune_run, "write_outputs", during(tune_run.write_outputs))
        m.setattr(writer, "save_checkpoint", functools.partial(save_checkpoint, grouped=True))
        run = tune_into_folder(load_user_model(str(folder / "m.py")), TuneOptions(dtype="bf16"), folder / "out",
                               latency=False)
    assert run.wrote_outputs and run.report.checkpoint is not None and run.report.checkpoint.lowered >= layers
    return counts


def test_the_report_phase_copies_to_the_host_a_fixed_number_of_times_whatever_the_depth(tmp_path, monkeypatch):
    """No per-tensor device-to-host copy after the search (issue 44: 1327 `.cpu()` calls for a GPT-2 774M on a
    GPU, three per tensor of its checkpoint): the checkpoint's tensors come to the host in groups, its check
    reads no tensor back, so the report phase's transfers do not grow with the layers."""
    shallow = _report_phase_transfers(tmp_path, monkeypatch, 1)
    deep = _report_phase_transfers(tmp_path, monkeypatch, 5)
    assert sum(deep.values()) <= 4, deep
    assert deep == shallow

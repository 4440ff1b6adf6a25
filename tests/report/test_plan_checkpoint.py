"""Plans as YAML, the converted checkpoint, tuner.load and attach."""
import copy

import pytest
import torch
from torch import nn

import tuner
from tuner.report.checkpoint import load, lowered_parameters, save_checkpoint
from tuner.core.errors import ConfigError, PlanMismatchError
from tuner.policy.plan import OpInstance, Plan
from tuner.testing import PlantedTask


def test_plan_roundtrip_and_validation(tmp_path):
    plan = Plan(dtype="bfloat16", preset="hmp", modules=(("enc.*", "fp32"),),
                fp32_instances=(OpInstance("a.b", "linear", 1),), metrics={"baseline": 0.9})
    assert plan.dtype == "bf16"
    plan.save(tmp_path / "plan.yaml")
    again = Plan.load(tmp_path / "plan.yaml")
    assert again == plan and again.metrics["baseline"] == 0.9
    assert Plan.load(tmp_path) == plan  # a folder means its plan.yaml
    text = (tmp_path / "plan.yaml").read_text().replace("version: 1", "version: 7")
    (tmp_path / "new.yaml").write_text(text)
    with pytest.raises(ConfigError, match="newer than this mpt"):
        Plan.load(tmp_path / "new.yaml")
    (tmp_path / "bad.yaml").write_text("version: 1\ndtype: bf16\npreset: hmpp\nfp32_instancs: []\n")
    with pytest.raises(ConfigError) as exc:
        Plan.load(tmp_path / "bad.yaml")
    assert "fp32_instances" in str(exc.value)  # unknown key suggests the near one
    with pytest.raises(ConfigError, match="did you mean"):
        Plan(preset="hmpp")


def test_plan_file_works_in_autocast(tmp_path):
    Plan(dtype="bf16", preset="torch-cpu", fp32_instances=(OpInstance("1", "linear", 0),)).save(tmp_path / "p.yaml")
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    with tuner.autocast(tmp_path / "p.yaml", model=net):
        h = net[0](torch.randn(2, 4))
        assert h.dtype == torch.bfloat16
    out = []
    with tuner.autocast(str(tmp_path / "p.yaml"), model=net, verbose=out.append):
        net(torch.randn(2, 4))
    assert [(d.module, d.compute) for d in out if d.op == "linear"] == [("0", torch.bfloat16), ("1", torch.float32)]


def _out_dir(tmp_path, model, plan, inputs):
    plan.save(tmp_path / "plan.yaml")
    info = save_checkpoint(model, plan, inputs, tmp_path / "model.safetensors")
    return info


def test_checkpoint_stores_lowered_params_and_load_reproduces_metric(tmp_path):
    task = PlantedTask(16, 1)
    model = task.build()
    fragile = next(iter(task.build().fragile_labels())).split(":")[0]
    plan = Plan(dtype="bf16", preset="torch-cpu", fp32_instances=(OpInstance(fragile, "linear", 0),))
    lowered = lowered_parameters(model, plan, task.example_inputs())
    assert "chain.0.weight" in lowered and f"{fragile}.weight" not in lowered
    info = _out_dir(tmp_path, model, plan, task.example_inputs())
    assert info.lowered == len(lowered) and info.bytes < info.fp32_bytes
    reference = copy.deepcopy(model)
    tuner.attach(reference, plan, engine="python")
    expected = task.evaluate(reference)
    loaded = load(task.build(), tmp_path)
    assert loaded.chain[0].weight.dtype == torch.bfloat16
    assert getattr(loaded, fragile.split(".")[0])[0].weight.dtype == torch.float32
    assert task.evaluate(loaded) == expected == 1.0
    with torch.no_grad():
        x = task.example_inputs()[0]
        assert torch.equal(loaded(x), reference(x))  # same bits as the plan run on the FP32 model


def test_all_bf16_checkpoint_is_about_half(tmp_path):
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    info = _out_dir(tmp_path, model, Plan(dtype="bf16", preset="torch-cpu"), (torch.randn(2, 64),))
    assert info.bytes <= 0.52 * info.fp32_bytes + 1024  # header bytes


def test_load_rejects_mismatches_and_corruption(tmp_path):
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    _out_dir(tmp_path, model, Plan(dtype="bf16", preset="torch-cpu",
                                   fp32_instances=(OpInstance("1", "linear", 0),)), (torch.randn(2, 8),))
    with pytest.raises(PlanMismatchError, match="shape"):
        load(nn.Sequential(nn.Linear(8, 4), nn.Linear(4, 2)), tmp_path)
    with pytest.raises(PlanMismatchError, match="missing"):
        load(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2), nn.Linear(2, 2)), tmp_path)
    with pytest.raises(PlanMismatchError, match="not in the model"):
        load(nn.Sequential(nn.Linear(8, 8)), tmp_path)
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(PlanMismatchError, match="truncated or corrupted"):
        load(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2)), tmp_path)


def test_attach_detach_and_hybrid_equals_engine():
    task = PlantedTask(16, 1)
    fragile = next(iter(task.build().fragile_labels())).split(":")[0]
    plan = Plan(dtype="bf16", preset="torch-cpu", fp32_instances=(OpInstance(fragile, "linear", 0),))
    x = task.example_inputs()[0]
    a, b = task.build(), task.build()
    tuner.attach(a, plan)  # torch.autocast + scoped engine
    tuner.attach(b, plan, engine="python")
    with torch.no_grad():
        assert torch.equal(a(x), b(x))
    tuner.detach(a)
    with torch.no_grad():
        assert torch.equal(a(x), task.build()(x))  # back to plain FP32


def _no_second_read(monkeypatch):
    """Make every way of reading a whole checkpoint back fail: the check after writing must not need one."""
    import tuner.core.direct_io
    import tuner.core.safetensors_write
    import tuner.report.checkpoint

    def refused(*args, **kwargs):
        raise AssertionError("the checkpoint was read back")

    for module in (tuner.report.checkpoint, tuner.core.safetensors_write, tuner.core.direct_io):
        for name in ("read_chunks", "sha256_file", "read_safetensors", "_FileReader"):
            monkeypatch.setattr(module, name, refused, raising=False)


@pytest.mark.parametrize("grouped", [False, True])
def test_the_checkpoint_is_hashed_as_written_and_checked_without_reading_it_back(tmp_path, monkeypatch, grouped):
    """plan.yaml's checkpoint sha256 is the file's real hash, taken as it was written (no second read of
    gigabytes, with the check on or off; `grouped`: the tensors come to the host in groups, as a GPU's do), and
    the lowered tensors are what tuner.load gives."""
    from tuner.core.fingerprint import sha256_file

    task = PlantedTask(16, 1)
    model = task.build()
    plan = Plan(dtype="bf16", preset="torch-cpu")
    tied = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    tied[1].weight = tied[0].weight  # one tensor, two names: the file holds it twice
    with monkeypatch.context() as m:
        _no_second_read(m)
        checked = save_checkpoint(model, plan, task.example_inputs(), tmp_path / "a.safetensors", check=True,
                                  grouped=grouped)
        unchecked = save_checkpoint(model, plan, task.example_inputs(), tmp_path / "b.safetensors", grouped=grouped)
        info = save_checkpoint(tied, plan, (torch.randn(2, 8),), tmp_path / "c.safetensors", check=True,
                               grouped=grouped)
    assert checked.sha256 == sha256_file(tmp_path / "a.safetensors") and checked.lowered > 0
    assert unchecked.sha256 == checked.sha256 and "sha256" not in unchecked.to_dict()
    assert info.sha256 == sha256_file(tmp_path / "c.safetensors")
    lowered = lowered_parameters(model, plan, task.example_inputs())
    Plan(dtype="bf16", preset="torch-cpu", checkpoint_sha256=checked.sha256).save(tmp_path / "plan.yaml")
    (tmp_path / "model.safetensors").write_bytes((tmp_path / "a.safetensors").read_bytes())
    loaded = load(task.build(), tmp_path)
    state = dict(loaded.state_dict())
    for name, dtype in lowered.items():
        assert state[name].dtype == dtype
        assert torch.equal(state[name], model.state_dict()[name].to(dtype))  # the trials' rounded values
"""`tuner.load(model, X)`: X is an output folder, a plan .yaml file or a Plan."""
import dataclasses

import pytest
import torch
from torch import nn

import tuner
from tuner.core.errors import ConfigError, PlanMismatchError
from tuner.core.fingerprint import sha256_file
from tuner.policy.plan import OpInstance, Plan
from tuner.report.checkpoint import save_checkpoint

PLAN = Plan(dtype="bf16", preset="torch-cpu", fp32_instances=(OpInstance("2", "linear", 0),))
X = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))


def build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()


def test_a_plan_file_saved_by_hand_and_a_plan_object_attach_to_the_model_as_it_is(tmp_path):
    PLAN.save(tmp_path / "plan.yaml")  # as `result.plan.save("plan.yaml")`: no checkpoint recorded, none beside
    with torch.no_grad(), tuner.autocast(PLAN, model=(reference := build())):
        expected = reference(X)
    for source in (tmp_path / "plan.yaml", str(tmp_path / "plan.yaml"), PLAN):
        loaded = tuner.load(build(), source)
        assert loaded[0].weight.dtype == torch.float32  # its own weights: nothing loaded
        with torch.no_grad():
            out = loaded(X)
        assert torch.equal(out, expected) and not torch.equal(out, build()(X))  # the plan runs


def test_a_plan_file_in_an_output_folder_loads_its_checkpoint(tmp_path):
    save_checkpoint(build(), PLAN, X, tmp_path / "model.safetensors")
    plan = dataclasses.replace(PLAN, checkpoint_sha256=sha256_file(tmp_path / "model.safetensors"))
    plan.save(tmp_path / "plan.yaml")
    by_file, by_folder = tuner.load(build(), tmp_path / "plan.yaml"), tuner.load(build(), tmp_path)
    assert by_file[0].weight.dtype == by_folder[0].weight.dtype == torch.bfloat16  # the checkpoint's
    assert by_file[2].weight.dtype == torch.float32
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(PlanMismatchError, match="no model.safetensors"):
        tuner.load(build(), tmp_path / "plan.yaml")  # the plan records a checkpoint: it must be there


def test_what_is_no_plan_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no such output folder or plan file"):
        tuner.load(build(), tmp_path / "missing")
    with pytest.raises(ConfigError, match="takes an output folder, a plan .yaml file or a Plan, found dict"):
        tuner.load(build(), {"dtype": "bf16"})


@pytest.mark.parametrize("recorded, shown", [("../../m.py", "m.py"), ("hf:../bert", "hf:runs/bert")])
def test_a_plan_for_another_model_names_its_paths_from_the_working_directory(tmp_path, monkeypatch, recorded, shown):
    """plan.yaml records the model relative to its own folder; the refusal (and the `tuner.load("hf:...")` it
    suggests) names it as a path that works where the user is, not as the plan folder's relative path."""
    from tuner.core.fingerprint import structure_digest
    from tuner.policy.plan import ModelRef

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    out = tmp_path / "runs" / "o"
    out.mkdir(parents=True)
    Plan(dtype="bf16", preset="torch-cpu",
         model=ModelRef(file=recorded, structure=structure_digest(net))).save(out / "plan.yaml")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PlanMismatchError) as info:
        tuner.load(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), "runs/o")
    assert f"made for another model ({shown})" in str(info.value)
    if shown.startswith("hf:"):
        assert f'tuner.load("{shown}", OUT)' in str(info.value)

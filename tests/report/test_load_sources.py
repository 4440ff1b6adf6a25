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

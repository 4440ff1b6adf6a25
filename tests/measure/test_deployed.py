"""tuner.measure.deployed: the ATen-level record of a deployed forward, and the checks that turn a claim that
does not hold into an internal error naming the module."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from tuner import OpInstance, Plan
from tuner.measure.deployed import NotAsClaimed, gemm_mismatches, observe, stored_as, verify, weight_dtypes
from tuner.report.checkpoint import check_checkpoint, plan_pass, save_checkpoint, verify_plan_pass

BF16, FP32 = torch.bfloat16, torch.float32


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.b.weight = self.a.weight  # tied: one tensor, two names

    def forward(self, x):
        return self.b(torch.relu(self.a(x))) + x @ self.a.weight  # a.weight also used by the root's own matmul


def test_a_parameter_is_lowered_only_when_every_use_casts_it_and_tied_names_go_together():
    model, x = Net().eval(), torch.randn(3, 8)
    low = weight_dtypes(model, Plan(), (x,))
    assert low == {"a.weight": BF16, "b.weight": BF16, "a.bias": BF16, "b.bias": BF16}
    island = Plan(fp32_instances=(OpInstance("", "matmul", 0),))  # the root's matmul reads a.weight in FP32
    assert weight_dtypes(model, island, (x,)) == {"a.bias": BF16, "b.bias": BF16}
    seen = observe(model, island, (x,))
    assert seen.gemms == {"a": {BF16}, "b": {BF16}, "": {FP32}}


def test_stored_as_puts_the_fp32_tensors_back():
    model = Net()
    before = {n: (p.data_ptr(), p.dtype) for n, p in model.named_parameters()}
    with stored_as(model, {"a.bias": BF16}):
        assert model.a.bias.dtype == BF16
    assert {n: (p.data_ptr(), p.dtype) for n, p in model.named_parameters()} == before


def test_a_claim_that_did_not_run_is_an_internal_error_naming_the_module():
    model, x = Net().eval(), torch.randn(3, 8)
    plan = Plan(fp32_instances=(OpInstance("a", "linear", 0),))
    planned = plan_pass(model, plan, (x,))
    assert planned.claimed["a"] == {FP32}
    verify_plan_pass(model, plan, (x,), planned)  # what ran is what the plan claims
    with pytest.raises(NotAsClaimed, match=r"\ba: matmuls/convs ran in float32, the plan claims bfloat16"):
        verify(model, plan, (x,), planned.lowered, {**planned.claimed, "a": {BF16}}, planned.tolerated)
    assert gemm_mismatches({"blk": {BF16}}, {"blk.inner": {BF16}}) == []  # a fused kernel does its children's work
    assert gemm_mismatches({"blk": {FP32}}, {"blk.inner": {BF16}}) != []


def test_a_checkpoint_that_does_not_give_the_trials_bits_is_an_internal_error(tmp_path):
    model, x = Net().eval(), torch.randn(3, 8)
    plan = Plan()
    planned = plan_pass(model, plan, (x,))
    path = tmp_path / "model.safetensors"
    save_checkpoint(model, plan, (x,), path, lowered=planned.lowered)
    check_checkpoint(model, plan, (x,), path, planned.lowered)  # loads and reproduces the trial's output
    tensors = load_file(str(path))
    tensors["a.bias"] = tensors["a.bias"] + 1
    save_file(tensors, str(path))
    with pytest.raises(NotAsClaimed, match="model.safetensors does not reproduce"):
        check_checkpoint(model, plan, (x,), path, planned.lowered)
    assert model.a.bias.dtype == FP32  # the model is left as it was


def test_saving_with_check_compares_the_file_written_within_the_same_packing(tmp_path, monkeypatch):
    import tuner.report.checkpoint as ckpt

    model, x = Net().eval(), torch.randn(3, 8)
    planned = plan_pass(model, Plan(), (x,))
    path = tmp_path / "model.safetensors"
    save_checkpoint(model, Plan(), (x,), path, lowered=planned.lowered, check=True)  # what it wrote is right
    written = ckpt._save

    def corrupted(tensors, where):  # a writer that changes one value on the way to disk
        written({**tensors, "a.bias": tensors["a.bias"] + 1}, where)

    monkeypatch.setattr(ckpt, "_save", corrupted)
    save_checkpoint(model, Plan(), (x,), path, lowered=planned.lowered)  # unchecked: nothing noticed
    with pytest.raises(NotAsClaimed, match="model.safetensors does not reproduce.*a.bias"):
        save_checkpoint(model, Plan(), (x,), path, lowered=planned.lowered, check=True)
    assert model.a.bias.dtype == FP32  # unpacked however the check ends


def test_the_plan_pass_takes_the_weight_dtypes_already_observed_and_observes_them_itself_otherwise(monkeypatch):
    import tuner.report.checkpoint as ckpt

    model, x = Net().eval(), torch.randn(3, 8)
    seen = weight_dtypes(model, Plan(), (x,))
    forwards = []
    monkeypatch.setattr(ckpt, "weight_dtypes", lambda *a: forwards.append(a) or weight_dtypes(*a))
    assert plan_pass(model, Plan(), (x,), lowered=seen).lowered == seen and not forwards
    assert plan_pass(model, Plan(), (x,)).lowered == seen and len(forwards) == 1


def test_a_forward_that_draws_random_numbers_is_compared_with_the_same_draws(tmp_path):
    class Noisy(Net):
        def forward(self, x):
            return super().forward(x) + 0.01 * torch.randn(x.shape[0], 8)

    model, x = Noisy().eval(), torch.randn(3, 8)
    planned = plan_pass(model, Plan(), (x,))
    save_checkpoint(model, Plan(), (x,), tmp_path / "model.safetensors", lowered=planned.lowered)
    state = torch.random.get_rng_state()
    check_checkpoint(model, Plan(), (x,), tmp_path / "model.safetensors", planned.lowered)
    assert torch.equal(torch.random.get_rng_state(), state)  # the user's generator is left as it was

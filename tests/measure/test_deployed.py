"""tuner.measure.deployed: the ATen-level record of a deployed forward, and the checks that turn a claim that
does not hold into an internal error naming the module."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

import tuner
from tuner import OpInstance, Plan
from tuner.measure.deployed import NotAsClaimed, gemm_mismatches, observe, stored_as, verify, weight_dtypes
from tuner.report.checkpoint import check_checkpoint, load, plan_pass, save_checkpoint, verify_plan_pass

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


def test_saving_with_check_catches_a_file_other_than_planned_without_reading_it_back(tmp_path, monkeypatch):
    """The check after writing reads the header back, not the data: a writer that lays out another dtype, or
    writes fewer bytes than it says, is an internal error, within the same packing; a byte changed on its way to
    the disk leaves the file's sha256 other than the one recorded, which tuner.load refuses."""
    import tuner.core.direct_io as dio
    import tuner.report.checkpoint as ckpt
    from tuner.core.errors import PlanMismatchError
    from tuner.core.fingerprint import sha256_file

    model, x = Net().eval(), torch.randn(3, 8)
    planned = plan_pass(model, Plan(), (x,))
    path = tmp_path / "model.safetensors"
    save_checkpoint(model, Plan(), (x,), path, lowered=planned.lowered, check=True)  # what it wrote is right
    written = ckpt._save

    def widened(tensors, where, **kwargs):  # a writer that stores one tensor in another dtype
        return written({**tensors, "a.bias": tensors["a.bias"].double()}, where, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(ckpt, "_save", widened)
        save_checkpoint(model, Plan(), (x,), path, lowered=planned.lowered)  # unchecked: nothing noticed
        with pytest.raises(NotAsClaimed, match="model.safetensors does not reproduce.*a.bias is F64"):
            save_checkpoint(model, Plan(), (x,), path, lowered=planned.lowered, check=True)
    assert model.a.bias.dtype == FP32  # unpacked however the check ends

    def short(tensors, where, **kwargs):  # the writer's count says more than the file holds
        done = written(tensors, where, **kwargs)
        return dataclasses.replace(done, size=done.size + 8)

    with monkeypatch.context() as m:
        m.setattr(ckpt, "_save", short)
        with pytest.raises(NotAsClaimed, match="bytes, .* were written"):
            save_checkpoint(model, Plan(), (x,), path, lowered=planned.lowered, check=True)

    real_write = dio.DirectWriter.write

    def flipped(self, data):  # one byte of the data changed on its way to the disk
        if not isinstance(data, bytes) and data.size > 4:
            data = data.copy()
            data[-1] ^= 1
        real_write(self, data)

    with monkeypatch.context() as m:
        m.setattr(dio.DirectWriter, "write", flipped)
        info = save_checkpoint(model, Plan(), (x,), path, lowered=planned.lowered, check=True)
    assert info.sha256 != sha256_file(path)
    Plan(checkpoint_sha256=info.sha256).save(tmp_path / "plan.yaml")
    with pytest.raises(PlanMismatchError, match="sha256 differs"):
        load(Net().eval(), tmp_path)


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


def _encoder() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
    mask = torch.zeros(3, 6, dtype=torch.bool)
    mask[1:, 4:] = True
    return model, torch.randn(3, 6, 16), mask


class OwnFP32Region(nn.Module):
    """An encoder the model runs inside its own `torch.autocast(enabled=False)`: all FP32 whatever the plan."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = _encoder()[0]
        self.head = nn.Linear(16, 4)

    def forward(self, x, mask):
        with torch.autocast("cpu", enabled=False):
            h = self.enc(x, src_key_padding_mask=mask)
        return self.head(h)


def _self_attention_fp32(layers: int) -> Plan:
    ops = (("linear", 0), ("linear", 1), ("scaled_dot_product_attention", 0))
    return Plan(fp32_instances=tuple(OpInstance(f"layers.{k}.self_attn", op, i) for k in range(layers)
                                     for op, i in ops))


@pytest.mark.parametrize("case", ["self-attention FP32, the rest lowered", "inside the model's own FP32 region"])
def test_an_encoder_that_stays_nested_runs_what_the_plan_claims_and_the_stored_model_gives_its_bits(case):
    """Issue 34: with every layer's self-attention FP32 (or all of the encoder FP32 by the model's own
    autocast block) no layer refuses the NestedTensor the encoder makes of a padded input, and the layers, their
    fused fast path off, run on it unfused: MultiheadAttention's fused kernel and NestedTensor linears, which
    reach the dispatcher as `linear`, not `addmm`. They are the deployed path, so the claims check must count
    them (it reported `ran in none` for linear1/linear2: an internal error) and the model stored as
    `tuner.load` stores it must give the trial's bits."""
    if case.startswith("self"):
        model, x, mask = _encoder()
        plan, linear = _self_attention_fp32(2), "layers.0.linear1"
    else:
        model, (_, x, mask) = OwnFP32Region().eval(), _encoder()
        plan, linear = Plan(), "enc.layers.0.linear1"
    inputs = (x, None, mask) if case.startswith("self") else (x, mask)
    planned = plan_pass(model, plan, inputs)
    trial = verify(model, plan, inputs, planned.lowered, planned.claimed, planned.tolerated)  # no NotAsClaimed
    assert trial.gemms[linear] == planned.claimed[linear] == ({BF16} if case.startswith("self") else {FP32})
    with torch.no_grad():
        for name, p in model.named_parameters():  # what tuner.load builds: these stored lowered, the plan attached
            p.data = p.data.to(planned.lowered.get(name, p.dtype))
        tuner.attach(model, plan)
        try:
            assert torch.equal(model(*inputs), trial.output)
        finally:
            tuner.detach(model)

"""ModelKeeper.borrowed(): the model goes back as built however the block that used it ends."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import tuner.measure.held as held_module
from tuner.workspace.keeper import ModelKeeper


def build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


def test_a_block_that_leaves_the_model_alone_costs_no_rebuild():
    keeper = ModelKeeper(build)
    with keeper.borrowed() as model:
        assert model is keeper.model
        with torch.no_grad():
            model(torch.ones(1, 4))
    assert keeper.rebuilds == 0 and keeper.model is model


def test_an_evaluate_that_trains_the_model_is_undone_on_exit():
    keeper = ModelKeeper(build)
    before = {k: v.clone() for k, v in keeper.model.state_dict().items()}
    with keeper.borrowed() as model:
        with torch.no_grad():
            for p in model.parameters():
                p.data.add_(1.0)  # through .data: no version counter bump, the weights' digest still sees it
    assert keeper.rebuilds == 1 and keeper.model is not model
    after = keeper.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_swapped_module_is_undone_even_when_the_block_raises():
    keeper = ModelKeeper(build)
    with pytest.raises(KeyboardInterrupt):
        with keeper.borrowed() as model:
            model[0] = nn.Identity()
            raise KeyboardInterrupt
    assert keeper.rebuilds == 1 and isinstance(keeper.model[0], nn.Linear)


def test_the_last_loan_gives_the_model_away_without_a_rebuild():
    builds = []

    def build() -> nn.Module:
        builds.append(1)
        torch.manual_seed(0)
        return nn.Linear(2, 2)

    keeper = ModelKeeper(build)
    with keeper.borrowed(last=True) as model:
        with torch.no_grad():
            model.weight.add_(1.0)  # a checkpoint loaded into it, say
    assert len(builds) == 1 and keeper.rebuilds == 0 and keeper.model is None
    with pytest.raises(RuntimeError, match="last loan"):
        with keeper.borrowed():
            pass


def test_lowered_parameters_stay_held_between_loans_and_the_model_comes_back_as_built(monkeypatch):
    packs: list[int] = []
    real_pack = held_module.pack
    monkeypatch.setattr(held_module, "pack", lambda p, d, s=None: packs.append(1) or real_pack(p, d, s))
    keeper = ModelKeeper(build)
    ref = {k: v.clone() for k, v in keeper.model.state_dict().items()}
    lowered = {"0.weight": torch.bfloat16}
    for _ in range(3):  # one trial after another storing the same weight lowered: packed once
        with keeper.borrowed(lowered=lowered) as model:
            assert model[0].weight.dtype == torch.bfloat16 and model[2].weight.dtype == torch.float32
            with torch.autocast("cpu", torch.bfloat16):
                model(torch.ones(1, 4))
    assert len(packs) == 1 and keeper.rebuilds == 0
    with keeper.borrowed() as model:  # a plain loan: the model as built
        assert all(torch.equal(ref[k].view(torch.int32), v.view(torch.int32)) for k, v in model.state_dict().items())
    assert keeper.rebuilds == 0


def test_an_evaluate_that_changes_a_held_parameter_is_undone(monkeypatch):
    keeper = ModelKeeper(build)
    ref = {k: v.clone() for k, v in keeper.model.state_dict().items()}
    with keeper.borrowed(lowered={"0.weight": torch.bfloat16}) as model:
        with torch.no_grad():
            model[0].weight.data.mul_(2.0)  # the packed bf16 values, behind the version counter's back
    assert keeper.rebuilds == 1
    with keeper.borrowed(lowered={"0.weight": torch.bfloat16}) as model:  # held again, from the rebuilt model
        assert torch.equal(model[0].weight.data, ref["0.weight"].to(torch.bfloat16))
    assert all(torch.equal(ref[k], v) for k, v in keeper.model.state_dict().items()) and keeper.rebuilds == 1


def test_holding_packs_once_for_the_verifying_forward_and_the_checkpoint(monkeypatch, tmp_path):
    """The report's verifying forward and the checkpoint written after it hold the same parameters lowered:
    through the keeper's holding they are packed once and the file holds the bits the trials ran with."""
    from tuner.core.inputs import ModelInputs
    from tuner.policy.plan import Plan
    from tuner.report.checkpoint import save_checkpoint

    packs: list[int] = []
    real_pack = held_module.pack
    monkeypatch.setattr(held_module, "pack", lambda p, d, s=None: packs.append(1) or real_pack(p, d, s))
    keeper = ModelKeeper(build)
    ref = {k: v.clone() for k, v in keeper.model.state_dict().items()}
    lowered = {"0.weight": torch.bfloat16, "2.weight": torch.bfloat16}
    with keeper.borrowed(lowered=lowered):  # the last trial held them
        pass
    assert len(packs) == 2
    model = keeper.model  # a plain use (the FP32 timing) puts them back
    assert model[0].weight.dtype == torch.float32
    with keeper.holding(model, lowered) as held:
        assert held is model and held[0].weight.dtype == torch.bfloat16
    assert held[0].weight.dtype == torch.bfloat16  # still held after the block
    save_checkpoint(keeper.modules, Plan(dtype="bf16", preset="torch-cpu"), ModelInputs(), tmp_path / "m.safetensors",
                    lowered=lowered, check=True, hold=keeper.holding)
    assert len(packs) == 4  # the two parameters once more, not twice more
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "m.safetensors"))
    assert saved["0.weight"].dtype == torch.bfloat16 and torch.equal(saved["0.weight"], ref["0.weight"].bfloat16())
    assert torch.equal(saved["0.bias"], ref["0.bias"])
    assert all(torch.equal(ref[k].view(torch.int32), v.view(torch.int32))
               for k, v in keeper.model.state_dict().items())  # and the model comes back as built
    with pytest.raises(ValueError, match="not the keeper's"):
        with keeper.holding(build(), lowered):
            pass


def test_a_light_loan_reads_no_weight_bytes_yet_a_hidden_write_is_undone_before_the_next_evaluate(monkeypatch):
    """The guide's forwards borrow lightly: no pass over the weights after each. A forward that writes a weight
    behind the version counter (through .data) is still caught, before the next loan that is not light."""
    import tuner.core.fingerprint as fingerprint

    reads: list[int] = []
    real = fingerprint._tensor_checksum
    monkeypatch.setattr(fingerprint, "_tensor_checksum", lambda t: reads.append(1) or real(t))
    keeper = ModelKeeper(build)
    ref = {k: v.clone() for k, v in keeper.model.state_dict().items()}
    reads.clear()
    for _ in range(3):
        with keeper.borrowed(light=True) as model, torch.no_grad():
            model(torch.ones(1, 4))
    assert not reads and keeper.rebuilds == 0  # three forwards, no weight read
    with keeper.borrowed(light=True) as model:
        model[0].weight.data.mul_(2.0)  # no version bump: the light comparison cannot see it
    assert keeper.rebuilds == 0
    with keeper.borrowed("evaluate") as model:  # compared before it is lent: rebuilt, the evaluate sees it as built
        assert keeper.rebuilds == 1 and torch.equal(model[0].weight, ref["0.weight"])
    with keeper.borrowed(light=True) as model:
        model[2] = nn.Identity()  # identities change: undone at once, as after any loan
    assert keeper.rebuilds == 2 and isinstance(keeper.modules[2], nn.Linear)
    with keeper.borrowed(light=True) as model:
        model[0].bias.data.zero_()
    assert torch.equal(keeper.model[0].bias, ref["0.bias"]) and keeper.rebuilds == 3  # `model` compares too


def test_a_hidden_write_to_a_held_weight_is_caught_even_when_the_next_light_loan_repacks_it():
    """A light loan writes a held (packed) weight behind torch's back; the next light loan puts that weight back
    (the guide's next prefix), which reads its bytes to know the state to expect. Those bytes must not become
    the expected state: the write is caught and the model rebuilt before any evaluate."""
    keeper = ModelKeeper(build)
    ref = {k: v.clone() for k, v in keeper.model.state_dict().items()}
    lowered = {"0.weight": torch.bfloat16}
    with keeper.borrowed(lowered=lowered, light=True) as model:
        model[0].weight.data.mul_(2.0)  # the packed bf16 values, no version bump
    with keeper.borrowed(light=True):  # put back to FP32 (from the doubled bf16 values)
        pass
    with keeper.borrowed(lowered=lowered, light=True):  # and packed again
        pass
    with keeper.borrowed("evaluate") as model:
        assert keeper.rebuilds == 1
        assert torch.equal(model[0].weight, ref["0.weight"])


def test_the_weights_digest_reads_no_weight_byte_and_is_the_model_as_built(monkeypatch):
    """The journal's and plan's weights digest comes from the checksums the keeper took of the model as built:
    no pass over the weights of its own (two passes over 3 GB for GPT-2 774M before), the same value."""
    import tuner.core.fingerprint as fingerprint

    reads: list[int] = []
    real = fingerprint._tensor_checksum
    monkeypatch.setattr(fingerprint, "_tensor_checksum", lambda t: reads.append(1) or real(t))
    keeper = ModelKeeper(build)
    reads.clear()
    assert keeper.weights_digest == fingerprint.weights_digest(build())
    reads.clear()
    keeper = ModelKeeper(build)
    reads.clear()
    digest = keeper.weights_digest
    assert not reads and digest == keeper.weights_digest
    with keeper.borrowed() as model:
        model[0] = nn.Linear(4, 4)  # swapped (other weights): rebuilt after the loan, the digest unchanged
    assert keeper.rebuilds == 1 and keeper.weights_digest == digest


def test_a_mapped_weights_lowered_copy_is_not_read_again_after_holding_it(tmp_path, monkeypatch):
    """The checksum a lowered copy of a file-mapped weight got when it was made is the keeper's record of it:
    holding it reads none of its bytes a second time (GPT-2 774M: 1.5 GB), and the record is what a full
    capture of the model gives."""
    from tuner.core import fingerprint

    torch.save(build().state_dict(), tmp_path / "w.pt")

    def mapped() -> nn.Module:
        m = build()
        m.load_state_dict(torch.load(tmp_path / "w.pt", mmap=True), assign=True)
        return m

    keeper = ModelKeeper(mapped)
    read: list[torch.dtype] = []
    real = fingerprint._tensor_checksum
    monkeypatch.setattr(fingerprint, "_tensor_checksum", lambda t: read.append(t.dtype) or real(t))
    lowered = {n: torch.bfloat16 for n, _ in keeper.modules.named_parameters()}
    with keeper.borrowed(lowered=lowered) as model:
        assert all(p.dtype == torch.bfloat16 for p in model.parameters())
        assert read.count(torch.bfloat16) == len(lowered)  # each copy read once so far: when it was made
    assert keeper._expected == fingerprint.ModelState.capture(keeper.modules)

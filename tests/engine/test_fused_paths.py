"""torch's fused paths under an attached plan: an nn.TransformerEncoder given a padding mask (issue 34)."""
from __future__ import annotations

import torch

import tuner
from tuner.measure.deployed import stored_as, weight_dtypes
from tuner.policy.plan import Plan


def test_an_encoder_with_a_padding_mask_runs_its_lowered_layers_unnested_as_stored():
    """The encoder nests its input (its first layer looks fit for the fused path), its layers, holding lowered
    weights, refuse the NestedTensor: the attached plan runs the encoder again unnested instead of failing, the
    valid positions as the FP32 model gives them up to bf16 rounding, and leaves the encoder as it found it."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 2).eval()
    x = torch.randn(3, 6, 16)
    mask = torch.zeros(3, 6, dtype=torch.bool)
    mask[:, 4:] = True
    plan = Plan(dtype="bf16", preset="torch-cpu")
    with torch.no_grad():
        ref = model(x, src_key_padding_mask=mask)
        lowered = weight_dtypes(model, plan, (x, None, mask))
        assert "layers.0.self_attn.in_proj_bias" in lowered  # what makes the fused layer refuse
        with stored_as(model, lowered):
            tuner.attach(model, plan)
            try:
                out = model(x, src_key_padding_mask=mask)
            finally:
                tuner.detach(model)
    valid = ~mask
    assert (out[valid] - ref[valid]).abs().max() < 0.1 and out.dtype == torch.float32
    assert model.use_nested_tensor and model.forward.__func__ is torch.nn.TransformerEncoder.forward


def test_the_layers_whose_fused_fast_path_the_plan_turns_off_are_named_and_said():
    """Issue 34: an attached plan turns torch's fused encoder-layer path off (a hook) in every layer outside an
    FP32 module override, so a user who timed the FP32 model on that path learns why the tuned one is not on it:
    `Execution.unfused` names them and `describe()` (report.json's summary, a report.md row) says so."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    model = torch.nn.Sequential(torch.nn.TransformerEncoder(layer, 2), torch.nn.TransformerEncoderLayer(
        16, 2, 32, dropout=0.0, batch_first=True), torch.nn.MultiheadAttention(16, 2, batch_first=True)).eval()
    tuner.attach(model, Plan(dtype="bf16", preset="torch-cpu"))
    try:
        ex = tuner.attached(model)
        assert ex is not None and ex.unfused == ("0.layers.0", "0.layers.1", "1") and ex.unnested == ("0",)
        assert "fused fast path off in 3 nn.TransformerEncoderLayer(s)" in ex.describe()
        assert all(model.get_submodule(p)._forward_pre_hooks for p in ex.unfused)
    finally:
        tuner.detach(model)
    assert not any(m._forward_pre_hooks for m in model.modules())
    tuner.attach(model, Plan(dtype="bf16", preset="torch-cpu", modules={"0": "fp32", "1": "fp32"}))
    try:
        ex = tuner.attached(model)
        assert ex is not None and ex.unfused == () and ex.fast_paths() == ""  # all FP32 there: torch's path runs
    finally:
        tuner.detach(model)



class _Encoded(torch.nn.Module):
    """A model that hides an nn.TransformerEncoder, given a padding mask."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.enc = torch.nn.TransformerEncoder(layer, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.enc(x, src_key_padding_mask=mask)


def test_a_plan_on_fp32_weights_runs_the_encoder_as_the_trials_ran_it():
    """Issue 40: `tuner.load(model, Plan)` attaches the plan to the FP32 weights (the path after `from_pretrained`).
    With its first layer FP32 and its second low, the encoder's lowered weights (the trials', the checkpoint's)
    make the second layer refuse the NestedTensor; FP32 weights took it (MultiheadAttention's fused kernel,
    NestedTensor linears), another path with other numbers. The loaded model now gives the trial's output bit for
    bit, as does the plan whose every layer runs low (whose lowered layer norm failed on the NestedTensor)."""
    x = torch.randn(3, 6, 16)
    mask = torch.zeros(3, 6, dtype=torch.bool)
    mask[1, 4:] = mask[2, 3:] = True
    for plan in (Plan(dtype="bf16", preset="torch-cpu", modules=(("enc.layers.0", "fp32"),)),
                 Plan(dtype="bf16", preset="torch-cpu")):
        model = _Encoded().eval()
        with torch.no_grad(), stored_as(model, weight_dtypes(model, plan, (x, mask))):
            tuner.attach(model, plan)
            trial = model(x, mask)
            tuner.detach(model)
        with torch.no_grad():
            loaded = tuner.load(_Encoded().eval(), plan)(x, mask)
        assert torch.equal(trial, loaded), plan.modules

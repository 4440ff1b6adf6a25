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

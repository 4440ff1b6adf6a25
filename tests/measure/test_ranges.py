"""The range rule: which candidates leave fp16's range in FP32, and the chains a forward follows (issue 39)."""
import math

import torch

from tests.assets import fp16_chains
from tuner.core.inputs import ModelInputs
from tuner.measure.ranges import RangeRecorder, RangeSide, beyond_range, follow_chains, record_ranges
from tuner.measure.ranking import rank_gradient
from tuner.policy.presets import load_preset
from tuner.search.candidates import find_candidates

POLICY = load_preset("torch-cpu")
F16 = torch.float16


def _found(build):
    model, inputs = build(), ModelInputs.of(fp16_chains.example_inputs())
    return model, inputs, find_candidates(model, inputs, POLICY, F16, {})


def test_the_producer_and_the_consumer_that_casts_its_output_both_leave_the_range():
    model, inputs, found = _found(fp16_chains.build_geglu)
    ranges = record_ranges(model, inputs, POLICY, F16, found.instances)
    kept = {c.label(): r for c, r in beyond_range(ranges.magnitudes, F16, "fp16").items()}
    assert set(kept) == {"mlp1:mul#0", "mlp1.down_proj:linear#0"}
    assert kept["mlp1:mul#0"].side is RangeSide.OUTPUT
    assert kept["mlp1.down_proj:linear#0"].side is RangeSide.INPUT  # its own cast of the FP32 product
    assert "> fp16 max 65504" in kept["mlp1.down_proj:linear#0"].text()
    assert not beyond_range(ranges.magnitudes, torch.bfloat16, "bf16")  # bf16 holds FP32's range
    assert not ranges.nonfinite


def test_forwards_follow_a_chain_until_the_output_is_finite():
    model, inputs, found = _found(fp16_chains.build_mlp)
    kept, forwards = follow_chains(model, inputs, POLICY, F16, list(found.instances), {}, "fp16")
    assert [c.label() for c in kept] == ["layers.2:linear#0", "layers.3:linear#0"]
    assert forwards == 3  # two that found an overflow, one finite
    assert all(r.side is RangeSide.CHAIN for r in kept.values())


def test_the_gradient_ranking_scores_a_consumer_that_overflows_alone_inf():
    """down_proj reads a product past fp16's range that the all-low reference already holds as inf: its own
    cast overflows when it alone runs low, so it is no harmless op (it scored 0.03% and ranked last)."""
    model, inputs, found = _found(fp16_chains.build_geglu)
    scores = rank_gradient(model, inputs, POLICY, F16, list(found.instances), found.ref_out, probes=2)
    by_label = {c.label(): s for c, s in scores.items()}
    assert math.isinf(by_label["mlp1.down_proj:linear#0"])
    assert math.isfinite(by_label["mlp0.down_proj:linear#0"])


def test_the_gradient_rankings_first_pass_records_the_same_ranges_as_a_forward_of_its_own():
    model, inputs, found = _found(fp16_chains.build_mlp)
    riding = RangeRecorder(found.instances)
    rank_gradient(model, inputs, POLICY, F16, list(found.instances), found.ref_out, probes=1, observer=riding)
    alone = record_ranges(model, inputs, POLICY, F16, found.instances)
    assert riding.ran and riding.ranges().magnitudes == alone.magnitudes


class _Masked(torch.nn.Module):
    """Attention with a mask filled with finfo.min, as transformers builds it for SDPA."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x):
        mask = torch.zeros(4, 4).masked_fill(torch.ones(4, 4).triu(1).bool(), torch.finfo(torch.float32).min)
        q = x[None, None]
        return self.proj(torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)[0, 0])


def test_a_masks_fill_value_is_no_value_past_the_range():
    model, inputs = _Masked().eval(), ModelInputs.of((torch.randn(4, 4),))
    found = find_candidates(model, inputs, POLICY, F16, {})
    ranges = record_ranges(model, inputs, POLICY, F16, found.instances)
    assert "(root):scaled_dot_product_attention#0" in {c.label() for c in found.instances}
    assert not beyond_range(ranges.magnitudes, F16, "fp16")

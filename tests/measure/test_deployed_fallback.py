"""A fallback chain's plan at the ATen level (issue 46): each weight stored in the one 16-bit dtype every use
casts it to, FP32 where two dtypes read it; the claims check counts the matmul/conv FLOPs per dtype."""
from __future__ import annotations

import pytest
import torch

from tests.measure.test_deployed import Net
from tuner import OpInstance, Plan
from tuner.measure.deployed import NotAsClaimed, verify, weight_dtypes
from tuner.report.checkpoint import plan_pass, verify_plan_pass

BF16, FP16 = torch.bfloat16, torch.float16
B_IN_BF16 = Plan(dtype="fp16", fallback="bf16", fallback_instances=(OpInstance("b", "linear", 0),))


def test_each_weight_is_stored_in_its_ops_dtype_and_fp32_where_two_dtypes_read_it():
    model, x = Net().eval(), torch.randn(3, 8)
    assert weight_dtypes(model, Plan(dtype="fp16"), (x,)) == {"a.weight": FP16, "b.weight": FP16,
                                                              "a.bias": FP16, "b.bias": FP16}
    # a.weight (tied to b.weight) is read by a's and the root's fp16 casts and by b's bf16 one: FP32
    assert weight_dtypes(model, B_IN_BF16, (x,)) == {"a.bias": FP16, "b.bias": BF16}


def test_the_claims_check_counts_each_16_bit_dtype():
    model, x = Net().eval(), torch.randn(3, 8)
    planned = plan_pass(model, B_IN_BF16, (x,))
    split = planned.shares.dtype_shares()
    assert split["bf16"] > 0 and split["fp16"] > 0 and planned.shares.flop_share == 1.0
    verify_plan_pass(model, B_IN_BF16, (x,), planned)  # what the plan claims per dtype is what ran
    wrong = {"fp16": split["fp16"] + split["bf16"], "bf16": 0.0}  # the right 16-bit total, the wrong split
    with pytest.raises(NotAsClaimed, match="ran in bf16"):
        verify(model, B_IN_BF16, (x,), planned.lowered, planned.claimed, planned.tolerated,
               share=planned.shares.flop_share, by_dtype=wrong)

"""fp16 overflow chains (issue 39): the range rule keeps the chain FP32 before any evaluation, the search finds
the best plan at once, and the report's per-op numbers are measured as the trial runs them."""
import math

import torch

from tests.assets import fp16_chains
from tuner.measure.ranking import rank_exact
from tuner.policy.presets import load_preset
from tuner.report.reasons import ReasonKind, fp32_reasons
from tuner.search.candidates import find_candidates
from tuner.core.inputs import ModelInputs
from tuner.search.results import TuneStatus
from tuner.search.session import tune


def _tune(build):
    return tune(build, fp16_chains.evaluate, fp16_chains.example_inputs, dtype="fp16")


def test_a_geglu_product_into_down_proj_keeps_only_the_chain_fp32():
    result = _tune(fp16_chains.build_geglu)
    assert result.status is TuneStatus.MET
    fp32 = {i.label() for i in result.plan.fp32_instances}
    assert fp32 == {"mlp1:mul#0", "mlp1.down_proj:linear#0"}  # before: 8 of 14, 31% of FLOPs in fp16
    assert result.evals == 3  # the baseline's two runs and the range rule's plan
    assert "range" in result.phases.table() and result.phases.table()["range"]["evaluate"] == 0.0
    reasons = fp32_reasons(result, result.trials)
    assert {r.kind for r in reasons} == {ReasonKind.RANGE}
    assert all("> fp16 max 65504" in r.text("fp16") for r in reasons)
    assert all(r.score_text() == "inf (overflow)" for r in reasons)  # each overflows alone


def test_every_shown_estimate_is_at_least_a_tenth_of_the_op_alone():
    """A plan that keeps ops FP32 for their precision, not their range (bf16, no loss allowed): each number
    shown is measured with that op alone low (the gradient ranking charges an input's rounding to its
    producer: `mlp1:gelu#0` estimated 2e-7, alone 2e-4), or marked as an estimate."""
    result = tune(fp16_chains.build_geglu, fp16_chains.evaluate, fp16_chains.example_inputs, dtype="bf16",
                  tolerance=0.0, absolute=True)
    model, inputs = fp16_chains.build_geglu(), ModelInputs.of(fp16_chains.example_inputs())
    policy = load_preset("torch-cpu")
    found = find_candidates(model, inputs, policy, torch.bfloat16, {})
    shown = {r.label: r for r in fp32_reasons(result, result.trials)}
    alone = rank_exact(model, inputs, policy, torch.bfloat16, list(found.instances), found.ref_out,
                       only=[c for c in found.instances if c.label() in shown])
    for cand, error in alone.items():
        score = shown[cand.label()].score
        assert score is not None and (math.isinf(score) or score >= 0.1 * error), cand.label()
        assert not shown[cand.label()].estimated
    assert len(alone) >= 3

"""A plan that makes the model's own code raise is a failing plan, in a trial and in every forward mpt runs
besides (the guide's, the exact ranking's, the lowered-weights check), never the end of the tune: the model in
tests/assets/mixed_raise.py reads `torch.finfo(q.dtype)` from one tensor and applies it to another, so it runs
in FP32 and all-bf16 but raises with `query` FP32 and the attention matmul in bf16."""
from __future__ import annotations

import math
import time
from pathlib import Path

import torch

import tuner
from tuner.core.inputs import ModelInputs
from tuner.core.loader import load_user_model
from tuner.measure.ranking import rank_exact
from tuner.measure.shares import Shares
from tuner.policy.plan import OpInstance, Plan
from tuner.policy.presets import load_preset
from tuner.search.evaluator import Bounds, Evaluator
from tuner.search.noise import Acceptance
from tuner.workspace.keeper import ModelKeeper

MODEL = str(Path(__file__).parents[1] / "assets" / "mixed_raise.py")
QUERY = OpInstance("query", "linear", 0)
MIXED = Plan(dtype="bf16", fp32_instances=(QUERY,))  # query FP32, the matmuls bf16: masked_fill raises
RAISES_AT = "mixed_raise.py:27"


def _evaluator() -> tuple[Evaluator, ModelInputs, object]:
    """An Evaluator of the file's own evaluate (tuner.tune's Python path: not wrapped by load_user_model)."""
    user = load_user_model(MODEL)
    inputs = ModelInputs.of(user.example_inputs())
    ev = Evaluator(user.eval_fn, ModelKeeper(user.build), Bounds(time.monotonic()))
    ev.inputs = inputs
    with torch.no_grad():
        ref = user.build()(*inputs.args)
    return ev, inputs, ref


def test_a_trial_whose_forward_raises_fails_and_names_the_call():
    ev, _, _ = _evaluator()
    ev.baseline()
    trial = ev.trial(MIXED, "query FP32", Shares(), Acceptance(target=0.9))
    assert not trial.passed and trial.metric is None
    assert trial.error is not None and "BFloat16" in trial.error and RAISES_AT in trial.error


def test_a_guide_forward_that_raises_is_a_failing_plan_not_the_end_of_the_tune():
    ev, _, ref = _evaluator()
    assert ev.output_error(MIXED, ref) == math.inf
    assert ev.raised and RAISES_AT in ev.raised[0] and "BFloat16" in ev.raised[0]
    assert ev.output_error(Plan(dtype="bf16"), ref) < 0.1  # all-low runs: only the mixed plan fails


def test_the_exact_ranking_scores_an_op_that_raises_alone_as_failing():
    user = load_user_model(MODEL)
    model, inputs = user.build(), ModelInputs.of(user.example_inputs())
    with torch.no_grad():
        ref = model(*inputs.args)
    matmul = OpInstance("", "matmul", 0)
    policy, seen = load_preset("torch-cpu"), []
    scores = rank_exact(model, inputs, policy, torch.bfloat16, [QUERY, matmul], ref)
    assert scores[matmul] == math.inf  # q FP32, the scores bf16: masked_fill raises
    assert math.isfinite(scores[QUERY])
    rank_exact(model, inputs, policy, torch.bfloat16, [QUERY, matmul], ref, only=[matmul],
               raised=lambda c, exc: seen.append((c, "BFloat16" in str(exc))))
    assert seen == [(matmul, True)]  # told, so the session's note names the call


def test_the_tune_learns_which_ops_go_together():
    user = load_user_model(MODEL)
    result = tuner.tune(user.build, user.evaluate, user.example_inputs, dtype="bf16", tolerance=2e-5,
                        progress=False)
    assert result.chosen is not None and result.metric is not None and result.metric >= result.target
    assert QUERY not in result.plan.fp32_instances or OpInstance("", "matmul", 0) in result.plan.fp32_instances
    assert any(RAISES_AT in note for note in result.notes)

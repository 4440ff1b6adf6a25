"""A fallback chain (issue 46): an op that fails in the tune's dtype runs in the other 16-bit dtype, FP32 last.
The range rule sends what leaves fp16's range to bf16 with no evaluation; the search tries the units it keeps
FP32 in the fallback dtype (at most CHAIN_TRIALS evaluations past its own); bf16 falls back to fp16 alike."""
import dataclasses
import math

import torch
from torch import nn

from tests.assets import fp16_chains
from tests.search.test_training_mode import FP16, X, Amplified, Trainer
from tuner.search.results import TuneStatus
from tuner.search.session import CHAIN_TRIALS, tune
from tuner.workspace.journal import Journal, RunFingerprint


def _chain(build):
    return tune(build, fp16_chains.evaluate, fp16_chains.example_inputs, dtype="fp16", fallback="bf16")


def test_the_range_rule_sends_an_fp16_overflow_to_bf16_with_no_evaluation():
    """Without the chain the GeGLU's product and down_proj stay FP32 (4 of 14, 31% of FLOPs in fp16 before
    issue 39's range rule, 84% after it); with it nothing is FP32 and every matmul FLOP is 16-bit."""
    result = _chain(fp16_chains.build_geglu)
    assert result.status is TuneStatus.MET and result.evals == 3  # the baseline's two runs and the rule's plan
    assert result.plan.fp32_instances == ()
    assert {"mlp1:mul#0", "mlp1.down_proj:linear#0"} <= {i.label() for i in result.plan.fallback_instances}
    assert result.plan.fallback == "bf16" and set(result.range_kept) == {"mlp1:mul#0", "mlp1.down_proj:linear#0"}
    assert result.recorded is not None and result.recorded.shares.flop_share == 1.0
    shares = result.recorded.shares.dtype_shares()
    assert shares["fp16"] > 0.5 and shares["bf16"] > 0.1 and shares["fp32"] == 0.0
    assert any("in bf16 (the fallback dtype)" in n for n in result.notes)


def test_a_chain_through_a_deep_mlp_runs_in_bf16_not_fp32():
    result = _chain(fp16_chains.build_deep)
    assert result.status is TuneStatus.MET and result.plan.fp32_instances == ()
    assert {i.label() for i in result.plan.fallback_instances} == {"layers.3:linear#0", "layers.4:linear#0"}


def test_an_overflow_only_training_shows_goes_to_bf16_after_the_search():
    """`Amplified` overflows in fp16 only on its training data (the example inputs are small): the range rule
    sees nothing, the search keeps `first` FP32 with the loss scaler's skipped steps, and the chain's trial
    runs the search's FP32 units in bf16 instead: trained with FP32 master weights and the scaler."""
    trainer = Trainer(scaler=True, gain=1e5)
    torch.manual_seed(1234)
    result = tune(Amplified, trainer, (X[:8],), dataclasses.replace(FP16, fallback="bf16"))
    assert result.status is TuneStatus.MET and result.plan.for_training
    assert result.plan.fp32_instances == ()
    assert "first:linear#0" in {i.label() for i in result.plan.fallback_instances}
    assert trainer.dtypes == {torch.float32}
    bound = math.ceil(math.log2(len(result.candidates))) + 4
    assert result.evals <= bound + CHAIN_TRIALS
    assert any(n.startswith("fallback chain:") and "1 evaluation(s) past the search's" in n for n in result.notes)
    chosen = next(t for t in result.trials if t.n == result.chosen)
    assert chosen.fallback and not chosen.fp32


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 64), nn.Tanh(), nn.Linear(64, 8))


BATCHES = [torch.randn(32, 64, generator=torch.Generator().manual_seed(i)) for i in range(2)]


def test_bf16_falls_back_to_fp16_where_its_precision_is_short():
    """A relative-error target bf16 misses (~4e-3 all low) and fp16 meets (~6e-4): without the chain the
    plan keeps the linears FP32; with `--fallback fp16` they run in fp16 and nothing is FP32."""
    plain = tune(_mlp, None, BATCHES, dtype="bf16", metric="rel-error", tolerance=1.5e-3)
    assert plain.plan.fp32_instances
    result = tune(_mlp, None, BATCHES, dtype="bf16", fallback="fp16", metric="rel-error", tolerance=1.5e-3)
    assert result.status is TuneStatus.MET and result.plan.fp32_instances == ()
    assert result.plan.fallback == "fp16" and result.plan.fallback_instances
    assert result.recorded is not None and result.recorded.shares.flop_share == 1.0
    assert result.evals <= plain.evals + CHAIN_TRIALS


def test_a_resumed_chain_reads_its_fallback_trials_from_the_journal(tmp_path):
    """A trial's journal key names its fallback instances: a resumed run repeats no evaluation, the chain's
    included, and writes the same plan."""
    def run(resume):
        journal = Journal(tmp_path / "journal.jsonl", RunFingerprint(source="s", weights="w"), resume=resume)
        return tune(_mlp, None, BATCHES, dtype="bf16", fallback="fp16", metric="rel-error", tolerance=1.5e-3,
                    journal=journal)

    whole = run(False)
    again = run(True)
    assert whole.plan.fallback_instances and again.plan == whole.plan
    assert [t.from_journal for t in again.trials] == [True] * len(whole.trials)
    assert [t.fallback for t in again.trials] == [t.fallback for t in whole.trials]


def test_a_bound_before_the_chains_trial_keeps_the_searchs_plan_and_says_so():
    plain = tune(_mlp, None, BATCHES, dtype="bf16", metric="rel-error", tolerance=1.5e-3)
    cut = tune(_mlp, None, BATCHES, dtype="bf16", fallback="fp16", metric="rel-error", tolerance=1.5e-3,
               max_evals=plain.evals)
    assert cut.stopped == "max_evals" and cut.status is TuneStatus.MET
    assert cut.plan.fp32_instances == plain.plan.fp32_instances and not cut.plan.fallback_instances
    assert any("not tried in fp16 (a bound was reached)" in n for n in cut.notes)

"""RNNs (nn.GRU, nn.RNN, nn.LSTM) after a lowered layer: mpt's engine runs them, and a tune's plan, its
trials and the loaded model agree on the dtype of every RNN matmul (torch.autocast lowers a GRU's gate
matmuls through `linear`, an LSTM through mkldnn_rnn_layer)."""
import pytest
import torch
from torch import nn

import tuner
from tuner.engine.function_mode import PrecisionEngine
from tuner.measure.deployed import observe
from tuner.policy.presets import load_preset

KINDS = {"gru": nn.GRU, "rnn": nn.RNN, "lstm": nn.LSTM}
X = torch.randn(6, 5, 8, generator=torch.Generator().manual_seed(1))


class Net(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.emb = nn.Linear(8, 16)
        self.rnn = KINDS[kind](16, 16, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        y, _ = self.rnn(self.emb(x))
        return self.head(y[:, -1])


def build(kind: str) -> nn.Module:
    torch.manual_seed(0)
    return Net(kind).eval()


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("override", [None, "rnn"])
def test_engine_runs_an_rnn_fed_by_a_lowered_layer(kind, override):
    """Without the engine's RNN hook, nn.RNNBase.check_input raises on the bf16 activation (autocast is off)."""
    model, decisions = build(kind), []
    overrides = {override: torch.float32} if override else None
    with torch.no_grad(), PrecisionEngine(load_preset("torch-cpu"), torch.bfloat16, root=model,
                                          module_overrides=overrides, verbose=decisions.append):
        out = model(X)
    assert torch.isfinite(out).all()
    rnn_ops = [d for d in decisions if d.module == "rnn" and d.op in ("gru", "rnn_tanh", "lstm",
                                                                         "mkldnn_rnn_layer")]
    assert rnn_ops, [(d.module, d.op) for d in decisions]
    assert rnn_ops[0].compute is (torch.float32 if override else torch.bfloat16)


@pytest.mark.parametrize("kind", ["gru", "rnn"])
def test_tuned_rnn_plan_runs_as_claimed_when_loaded(kind):
    """A tune keeps or lowers the RNN; whichever it claims, the loaded model's RNN matmuls run in that dtype."""
    ref = build(kind)(X).detach()

    def evaluate(m):
        with torch.no_grad():
            return float(torch.nn.functional.cosine_similarity(m(X).flatten(), ref.flatten(), dim=0))

    result = tuner.tune(lambda: build(kind), evaluate, dtype="bf16", tolerance=1e-6, example_inputs=(X,))
    plan = result.plan
    claimed_fp32 = any(i.module == "rnn" for i in plan.fp32_instances) or any(
        p == "rnn" for p, _ in plan.modules)
    seen = observe(build(kind), plan, (X,)).gemms.get("rnn", set())
    assert seen == ({torch.float32} if claimed_fp32 else {torch.bfloat16}), (plan.to_dict(), seen)

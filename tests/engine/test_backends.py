"""A CUDA tune's RNN configuration, run on CPU tensors (issue 44).

On CUDA, torch.autocast runs an nn.LSTM/GRU/RNN through cuDNN's `_cudnn_rnn`, whose autocast wrapper computes in
float16 whatever autocast's dtype: the engine must name such a call `_cudnn_rnn` (torch-cuda lists it lower) and
run it lowered under torch.autocast, or the claims say float32 where the GPU ran float16 (the zoo's LSTM LM on
cuda ended in NotAsClaimed). `PrecisionEngine(backend=BACKENDS["cuda"])` runs that configuration here.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from tuner.engine.backends import BACKENDS, rnn_aten_name
from tuner.engine.function_mode import LOWER_DTYPES, PrecisionEngine
from tuner.measure.flops import aten_flops, op_flops
from tuner.policy.presets import load_preset
from tuner.policy.rules import Rule


class RnnLM(nn.Module):
    def __init__(self, rnn: type[nn.RNNBase]) -> None:
        super().__init__()
        self.embed, self.rnn, self.head = nn.Embedding(20, 8), rnn(8, 8, batch_first=True), nn.Linear(8, 20)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.embed(ids))[0])


@pytest.fixture
def cudnn(monkeypatch):
    """cuDNN present, as on a CUDA machine (the CPU build has none)."""
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, "enabled", True)


def _decisions(model: nn.Module, policy_name: str, backend) -> dict:
    policy = dataclasses.replace(load_preset(policy_name), device=None, native=None)  # its lists, on CPU tensors
    found = {}
    with torch.no_grad(), PrecisionEngine(policy, torch.bfloat16, root=model, backend=backend,
                                          recorder=lambda d, *rest: found.setdefault((d.module, d.op), d)):
        model(torch.randint(0, 20, (2, 5)))
    return found


def _cpu_runs_a_bf16_lstm() -> bool:
    """Whether this CPU's oneDNN builds a bf16 LSTM (not on an AVX2-only CPU, or with its ISA capped to AVX2)."""
    try:
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
            nn.LSTM(8, 8)(torch.randn(3, 2, 8))
    except RuntimeError:
        return False
    return True


@pytest.mark.parametrize("rnn", [nn.LSTM, nn.GRU, nn.RNN])
def test_cuda_configuration_names_the_rnn_cudnn_rnn_and_runs_it_low(cudnn, rnn):
    if rnn is nn.LSTM and not _cpu_runs_a_bf16_lstm():
        # the CUDA configuration runs `_cudnn_rnn` under torch.autocast; on CPU tensors that is oneDNN's LSTM,
        # which has no bf16 kernel below AVX512 (a GPU runs cuDNN's): nothing here to emulate it with
        pytest.skip("this CPU's oneDNN has no bf16 LSTM (AVX2)")
    torch.manual_seed(0)
    found = _decisions(RnnLM(rnn).eval(), "torch-cuda", BACKENDS["cuda"])
    d = found[("rnn", "_cudnn_rnn")]
    assert d.rule is Rule.LOWER and d.ran in LOWER_DTYPES  # claimed low, as the GPU runs it (float16 there)


def test_cpu_configuration_keeps_onednn_for_lstm_only():
    torch.manual_seed(0)
    assert ("rnn", "mkldnn_rnn_layer") in _decisions(RnnLM(nn.LSTM).eval(), "torch-cpu", None)
    assert ("rnn", "gru") in _decisions(RnnLM(nn.GRU).eval(), "torch-cpu", None)


def test_cudnn_takes_what_it_accepts(cudnn):
    cuda = BACKENDS["cuda"]
    x, h = torch.randn(5, 2, 8), torch.zeros(1, 2, 8)
    assert cuda.aten_name("gru", (x, h, [])) == "_cudnn_rnn"
    assert cuda.aten_name("lstm", (x.bfloat16(), (h, h), [])) is None  # cuDNN refuses bf16 input: native cells
    assert rnn_aten_name("lstm", (x, (h, h), []), None) == "mkldnn_rnn_layer" or not torch.backends.mkldnn.enabled
    assert rnn_aten_name("gru", (x, h, []), None) is None  # CPU: no fused GRU kernel


def test_cudnn_rnn_flops_are_the_lstm_calls():
    """The deployed count (`aten_flops`, per ATen call) and the report's (`op_flops`, per torch.lstm call) agree."""
    lstm = nn.LSTM(8, 6, num_layers=2)
    x, h = torch.randn(5, 3, 8), torch.zeros(2, 3, 6)
    weights = list(lstm._flat_weights)
    python = op_flops("lstm", (x, (h, h), weights, True, 2, 0.0, False, False, False), {}, None)
    aten = aten_flops("_cudnn_rnn", (x, weights, 4, None, h, h, 2, 6, 0, 2, False, 0.0, False, False, []), {},
                      (torch.zeros(5, 3, 6),))
    assert python == aten > 0

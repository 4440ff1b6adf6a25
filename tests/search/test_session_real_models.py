"""The tune session on the shapes real models have: keyword inputs, structured outputs, neutral ops,
modules torch.autocast cannot run, and no plan override that changes nothing."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

import tuner
from tests.engine.test_probe import AutocastAllergic
from tuner.core.inputs import ModelInputs
from tuner.policy.presets import load_preset
from tuner.search.candidates import Candidates, find_candidates
from tuner.search.session import tune
from tuner.options.tune import TuneOptions
from tuner.workspace.journal import Journal, RunFingerprint

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Output:
    token_ids: torch.Tensor
    logits: torch.Tensor


class KwargsNet(nn.Module):
    """HF-like: keyword inputs, a dataclass output whose first tensor is an integer one."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(40, 16)
        self.fc = nn.Linear(16, 16)
        self.head = nn.Linear(16, 5)
        self.drop = nn.Dropout(0.1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> Output:
        h = self.drop(self.fc(self.embed(input_ids)))
        h = h.transpose(0, 1).contiguous().transpose(0, 1).reshape(h.shape)  # neutral shuffling
        if attention_mask is not None:
            h = h * attention_mask.unsqueeze(-1)
        return Output(token_ids=input_ids, logits=self.head(torch.tanh(h)))


def kwargs_inputs() -> dict:
    g = torch.Generator().manual_seed(0)
    return {"input_ids": torch.randint(0, 40, (4, 6), generator=g), "attention_mask": torch.ones(4, 6)}


def build_kwargs() -> nn.Module:
    torch.manual_seed(0)
    return KwargsNet().eval()


def test_keyword_inputs_recorded_without_example_inputs(tmp_path):
    """No example_inputs(): the first forward call's kwargs are recorded, kept for --resume and used."""
    data = kwargs_inputs()
    ref = build_kwargs()(**data).logits.detach()

    def evaluate(model):
        with torch.no_grad():
            out = model(**data)
        return -float((out.logits.float() - ref).abs().max())

    header = RunFingerprint(source="s", weights="w", settings={})
    journal = Journal(tmp_path / "journal.jsonl", header, resume=False)
    opts = TuneOptions(tolerance=1e-6, absolute=True)
    result = tune(build_kwargs, evaluate, None, opts, journal=journal)
    assert isinstance(result.inputs, ModelInputs) and set(result.inputs.kwargs) == {"input_ids", "attention_mask"}
    assert result.candidates  # the recorded call reached the model with its keyword arguments
    kept = journal.load_inputs()
    assert kept is not None and torch.equal(kept.kwargs["input_ids"], data["input_ids"])


def candidates_of(model: nn.Module, inputs: object) -> Candidates:
    return find_candidates(model, ModelInputs.of(inputs), load_preset("torch-cpu"), torch.bfloat16, {})


def test_neutral_ops_are_never_candidates():
    found = candidates_of(build_kwargs(), kwargs_inputs())
    ops = {c.op for c in found.instances}
    assert ops and ops <= {"linear", "mul", "tanh"}, ops
    assert not ops & {"transpose", "contiguous", "reshape", "dropout", "embedding"}


class WithAllergic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.rnn = AutocastAllergic()  # raises under torch.autocast, like oneDNN's bf16 LSTM on AVX2
        self.out = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.rnn(self.inp(x))))


def test_module_autocast_cannot_run_stays_fp32_and_the_loaded_plan_runs(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(8, 8)

    def build():
        torch.manual_seed(0)
        return WithAllergic().eval()

    ref = build()(x).detach()

    def evaluate(model):
        with torch.no_grad():
            return -float((model(x).float() - ref).abs().max())

    result = tune(build, evaluate, (x,), TuneOptions(tolerance=0.5, absolute=True))
    assert result.status == "ok"
    assert dict(result.plan.modules) == {"rnn": "fp32"}
    assert not any(c.module.startswith("rnn") for c in result.candidates)
    assert any("rnn" in n and "torch.autocast cannot run" in n for n in result.notes)
    model = tuner.attach(build(), result.plan)  # the tuner.load path: would raise without the override
    assert evaluate(model) == result.metric


LSTM_FILE = textwrap.dedent('''
    import torch
    from torch import nn

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.LSTM(16, 32, batch_first=True)
            self.head = nn.Linear(32, 20)

        def forward(self, x):
            return self.head(self.rnn(x)[0])

    def build_model():
        torch.manual_seed(0)
        return LM().eval()

    def example_inputs():
        return (torch.randn(4, 10, 16, generator=torch.Generator().manual_seed(1)),)

    _REF = None

    def evaluate(model):
        global _REF
        x = example_inputs()[0]
        with torch.no_grad():
            if _REF is None:
                _REF = build_model()(x)
            out = model(x).float()
        return float((out.argmax(-1) == _REF.argmax(-1)).float().mean())
''')

LOAD_AND_EVAL = textwrap.dedent('''
    import sys, json, tuner
    sys.path.insert(0, sys.argv[1])
    import lstm_lm as m
    model = tuner.load(m.build_model(), sys.argv[2])
    print(json.dumps({"metric": m.evaluate(model)}))
''')


def test_lstm_plan_loads_and_runs_on_an_avx2_only_cpu(tmp_path):
    """On a CPU without AVX512-BF16 (simulated: oneDNN and ATen capped to AVX2) torch.autocast cannot run a bf16
    nn.LSTM: the tuned plan must still load and reproduce its metric there."""
    (tmp_path / "lstm_lm.py").write_text(LSTM_FILE)
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2", ATEN_CPU_CAPABILITY="avx2")
    out = tmp_path / "out"
    tuned = subprocess.run([sys.executable, "-m", "mpt_cli", "tune", str(tmp_path / "lstm_lm.py"), "--out", str(out),
                            "--tolerance", "0.05", "--no-latency", "-q"], env=env, capture_output=True, text=True,
                           cwd=ROOT, timeout=300)
    assert tuned.returncode == 0, tuned.stdout + tuned.stderr
    plan = tuner.Plan.load(out / "plan.yaml")
    assert dict(plan.modules) in ({}, {"rnn": "fp32"})  # {} where oneDNN has a bf16 LSTM for an FP32 input
    loaded = subprocess.run([sys.executable, "-c", LOAD_AND_EVAL, str(tmp_path), str(out)], env=env,
                            capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert loaded.returncode == 0, loaded.stderr
    import json

    assert json.loads(loaded.stdout.strip().splitlines()[-1])["metric"] == plan.metrics["tuned"]

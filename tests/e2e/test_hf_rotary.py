"""`mpt tune hf:DIR` on a Llama whose rotary embedding computes as transformers' releases write it (issue 44).

transformers 5.17's Llama opens its rotary block only when autocast is on (`maybe_autocast`): the tune ended in an
internal NotAsClaimed (model.rotary_emb: matmuls ran in float32, the plan claims bf16). The installed
transformers' rotary forward is replaced by each release's own (`tests.assets.rotary_releases`), so the suite runs
the model code of the releases the project supports, whichever one CI installs.
"""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from tests.assets.rotary_releases import patch_llama
from tests.cli.test_bad_input import mpt

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny random-init LlamaForCausalLM folder and a batch of token ids."""
    root = tmp_path_factory.mktemp("llama")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    transformers.LlamaForCausalLM(config).save_pretrained(root / "model")
    ids = torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(1))
    save_file({"input_ids": ids}, root / "data.safetensors")
    return root


@pytest.mark.parametrize(("release", "dtype"), [("5.17", "bf16"), ("5.17", "fp16"), ("4.57", "bf16")])
def test_a_rotary_decoder_tunes_and_claims_what_runs(runner, llama, tmp_path, monkeypatch, release, dtype):
    patch_llama(monkeypatch, release)
    out = tmp_path / "out"
    res = mpt(runner, "tune", f"hf:{llama / 'model'}", "--metric", "kl", "--data", llama / "data.safetensors",
              "--dtype", dtype, "--out", out, "-q", "--no-latency")
    assert res.exit_code == 0, res.output
    report = json.loads((out / "report.json").read_text())
    assert (out / "plan.yaml").exists() and report["model_fp32_flop_share"] > 0  # the rotary's matmul, kept FP32

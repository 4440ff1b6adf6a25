"""An `hf:` folder's weights are mapped copy-on-write from its safetensors: a tune holds them lowered in copies
made once, never packed into (so never copied page by page into) their FP32 storage."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

import tuner.measure.held as held_module
from tests.cli.test_bad_input import mpt

transformers = pytest.importorskip("transformers")


def test_an_hf_tune_converts_each_lowered_weight_once_and_packs_none(runner, tmp_path, monkeypatch):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=2, n_head=2)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    save_file({"input_ids": torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))},
              tmp_path / "data.safetensors")
    loaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "gpt2")
    if not held_module._FileMappings().holds(loaded.transformer.h[0].mlp.c_fc.weight.data):
        pytest.skip("this transformers release (or OS) copies the weights into memory: they are packed in place")
    del loaded
    packs: list[int] = []
    copies: list[int] = []
    real_pack, real_copy = held_module.pack, held_module._Copy
    monkeypatch.setattr(held_module, "pack", lambda p, d, s=None: packs.append(1) or real_pack(p, d, s))
    monkeypatch.setattr(held_module, "_Copy", lambda *a: copies.append(1) or real_copy(*a))
    out = tmp_path / "out"
    res = mpt(runner, "tune", f"hf:{tmp_path / 'gpt2'}", "--metric", "kl", "--data", tmp_path / "data.safetensors",
              "--out", out, "-q", "--no-latency")
    assert res.exit_code == 0, res.output
    lowered = json.loads((out / "report.json").read_text())["checkpoint"]["lowered"]
    # the all-low trial, then (after the result phase's FP32 forwards) the report's forward and checkpoint:
    # before, two packings in place of every lowered weight
    assert lowered > 0 and not packs and len(copies) == lowered


def test_an_all_low_tune_reads_no_lowered_copy_again_after_its_trial(runner, tmp_path, monkeypatch):
    """The all-low plan's report and checkpoint need no FP32 forward (the tune ran them all), so the weights the
    trial held lowered stay held for them: neither put back nor checked again (before: every copy's bytes read
    twice more, its check on holding it again and the keeper's record of it)."""
    from tuner.core import fingerprint
    from tuner.search.session import TuneSession

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=2, n_head=2)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    save_file({"input_ids": torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))},
              tmp_path / "data.safetensors")
    after: list[bool] = [False]
    read: list[torch.dtype] = []
    real_run, real_sum = TuneSession.run, fingerprint._tensor_checksum

    def run(self):  # type: ignore[no-untyped-def]
        try:
            return real_run(self)
        finally:
            after[0] = True

    monkeypatch.setattr(TuneSession, "run", run)
    monkeypatch.setattr(fingerprint, "_tensor_checksum",
                        lambda t: (read.append(t.dtype) if after[0] else None) or real_sum(t))
    out = tmp_path / "out"
    res = mpt(runner, "tune", f"hf:{tmp_path / 'gpt2'}", "--metric", "kl", "--data", tmp_path / "data.safetensors",
              "--out", out, "-q", "--no-latency")
    assert res.exit_code == 0, res.output
    report = json.loads((out / "report.json").read_text())
    assert report["checkpoint"]["lowered"] > 0 and report["low_precision_flop_share"] == 1.0
    assert torch.bfloat16 not in read

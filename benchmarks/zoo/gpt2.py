"""Zoo model: a small GPT-2 (transformers GPT2LMHeadModel, random seeded weights); metric: KL to FP32.

    mpt tune benchmarks/zoo/gpt2.py --dtype bf16 --lower-is-better --absolute --tolerance 0.002 --out runs/gpt2

GPT2Config: vocabulary 2048, 4 layers, hidden 256, 4 heads, context 128, tied embeddings (3.7M
parameters), the default (sdpa) attention, called with keyword inputs (input_ids, attention_mask).

With GPT-2's init (std 0.02) the next-token distributions of a random model are close to uniform
and the KL between any two precisions is tiny, so every tolerance passes trivially. The init is
scaled instead: `initializer_range` 0.2 (10x): the logits then have a std of about 3 and peaked,
input-dependent distributions, and the attention is sharp, as in a trained model. No training:
building takes well under a second (after importing transformers) and is bit-for-bit deterministic (seed 0).

Data: 64 fixed random token sequences (seeded), right-padded to 96 tokens with lengths 48..96 and
the matching attention_mask, in 2 batches of 32. Metric: the mean over the non-padding positions of
KL(P_fp32 || P_model) of the next-token distributions, in nats (0 for the FP32 model; lower is
better, so tune with --lower-is-better --absolute).

MPT_ZOO_SIZE=tiny: vocabulary 128, 2 layers, hidden 32, 2 heads, 8 sequences of 16 tokens.
"""
from __future__ import annotations


import torch
from torch import nn

import _shared


def config() -> dict:
    if _shared.tiny():
        return {"vocab": 128, "layers": 2, "hidden": 32, "heads": 2, "seqs": 8, "len": 16, "batch": 8}
    return {"vocab": 2048, "layers": 4, "hidden": 256, "heads": 4, "seqs": 64, "len": 96, "batch": 32}


INIT_RANGE = 0.2


def data() -> tuple[torch.Tensor, torch.Tensor]:
    c = config()
    return _shared.padded_tokens(c["vocab"], c["seqs"], c["len"])


def build_model() -> nn.Module:
    import transformers

    transformers.logging.set_verbosity_error()
    c = config()
    cfg = transformers.GPT2Config(vocab_size=c["vocab"], n_positions=128, n_embd=c["hidden"], n_layer=c["layers"],
                                  n_head=c["heads"], initializer_range=INIT_RANGE, resid_pdrop=0.0, embd_pdrop=0.0,
                                  attn_pdrop=0.0, use_cache=False)
    with _shared.seeded(0):
        model = transformers.GPT2LMHeadModel(cfg)
    return model.eval()


def _logits(model: nn.Module) -> list[torch.Tensor]:
    return _shared.lm_logits(model, *data(), config()["batch"])


def evaluate(model: nn.Module) -> float:
    """Mean KL(P_fp32 || P_model) of the next-token distributions over the non-padding positions (nats)."""
    ref = _shared.reference(f"gpt2/{_shared.size()}", build_model, _logits, _shared.device_of(model))
    _, mask = data()
    b = config()["batch"]
    total, count = 0.0, 0
    for j, (r, out) in enumerate(zip(ref, _logits(model))):
        s, n = _shared.kl_sum(r, out, mask[j * b:(j + 1) * b])
        total, count = total + s, count + n
    return total / count


def example_inputs() -> dict[str, torch.Tensor]:
    ids, mask = data()
    return {"input_ids": ids[:4].clone(), "attention_mask": mask[:4].clone()}

"""Zoo model: a small Llama (transformers LlamaForCausalLM, random seeded weights); metric: top-1 agreement with FP32.

    mpt tune benchmarks/zoo/llama.py --dtype bf16 --tolerance 0.05 --out runs/llama

LlamaConfig: vocabulary 2048, 4 layers, hidden 256, intermediate 688 (SwiGLU), 4 query heads and 2
key/value heads (grouped-query attention), RMSNorm, rotary positions, untied head (4.0M parameters),
the default (sdpa) attention, called with keyword inputs (input_ids, attention_mask).

With the default init (std 0.02) a random Llama predicts near-uniform distributions and any
precision agrees with FP32 on them trivially. The init is scaled: `initializer_range` 0.2, which
gives logits with a std of about 3 and input-dependent top-1 tokens. No training: building takes
well under a second (after importing transformers) and is bit-for-bit deterministic (seed 0).

Data: 64 fixed random token sequences (seeded), right-padded to 96 tokens with lengths 48..96 and
the matching attention_mask, in 2 batches of 32. Metric: the share of non-padding positions whose
most likely next token equals the FP32 model's (1.0 for the FP32 model; higher is better).

MPT_ZOO_SIZE=tiny: vocabulary 128, 2 layers, hidden 32, 2 heads, 8 sequences of 16 tokens.
"""
from __future__ import annotations


import torch
from torch import nn

import _shared


def config() -> dict:
    if _shared.tiny():
        return {"vocab": 128, "layers": 2, "hidden": 32, "inter": 88, "heads": 2, "kv_heads": 1, "seqs": 8,
                "len": 16, "batch": 8}
    return {"vocab": 2048, "layers": 4, "hidden": 256, "inter": 688, "heads": 4, "kv_heads": 2, "seqs": 64,
            "len": 96, "batch": 32}


INIT_RANGE = 0.2


def data() -> tuple[torch.Tensor, torch.Tensor]:
    c = config()
    return _shared.padded_tokens(c["vocab"], c["seqs"], c["len"])


def build_model() -> nn.Module:
    import transformers

    transformers.logging.set_verbosity_error()
    c = config()
    cfg = transformers.LlamaConfig(vocab_size=c["vocab"], hidden_size=c["hidden"], intermediate_size=c["inter"],
                                   num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
                                   num_key_value_heads=c["kv_heads"], max_position_embeddings=256,
                                   initializer_range=INIT_RANGE, use_cache=False, tie_word_embeddings=False,
                                   pad_token_id=0)
    with _shared.seeded(0):
        model = transformers.LlamaForCausalLM(cfg)
    return model.eval()


def _logits(model: nn.Module) -> list[torch.Tensor]:
    return _shared.lm_logits(model, *data(), config()["batch"])


def evaluate(model: nn.Module) -> float:
    """Share of non-padding positions whose most likely next token matches the FP32 model's."""
    ref = _shared.reference(f"llama/{_shared.size()}", build_model, _logits, _shared.device_of(model))
    _, mask = data()
    b = config()["batch"]
    return _shared.agreement(ref, _logits(model), [mask[i:i + b] for i in range(0, len(mask), b)])


def example_inputs() -> dict[str, torch.Tensor]:
    ids, mask = data()
    return {"input_ids": ids[:4].clone(), "attention_mask": mask[:4].clone()}

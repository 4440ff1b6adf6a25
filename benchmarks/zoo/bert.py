"""Zoo model: a small BERT encoder (transformers BertModel, random seeded weights); metric: cosine to FP32.

    mpt tune benchmarks/zoo/bert.py --dtype bf16 --tolerance 1e-4 --out runs/bert

BertConfig: vocabulary 4096, 4 layers, hidden 256, 4 heads, intermediate 1024, with the pooler
(4.4M parameters), the default (sdpa) attention, BERT's init (std 0.02, seed 0), called with
keyword inputs (input_ids, token_type_ids, attention_mask). LayerNorm after every sublayer keeps a
random BERT's activations well scaled, so no init scaling is needed for a cosine metric.

Data: 64 fixed random "sentence pairs" (seeded): [CLS] a [SEP] b [SEP] with token_type_ids 0/1,
right-padded to 128 tokens with total lengths 64..128 and the matching attention_mask, in 2 batches
of 32. Metric: the mean of two cosine similarities to the FP32 model: of the mean-pooled
last_hidden_state per sequence, and of the pooler_output (the tanh-projected [CLS] token); 1.0 for
the FP32 model, higher is better.

MPT_ZOO_SIZE=tiny: vocabulary 128, 2 layers, hidden 32, 2 heads, 8 sequences of 16 tokens.
"""
from __future__ import annotations

import functools

import torch
from torch import nn

import _shared

CLS, SEP = 2, 3


def config() -> dict:
    if _shared.tiny():
        return {"vocab": 128, "layers": 2, "hidden": 32, "heads": 2, "inter": 128, "seqs": 8, "len": 16, "batch": 8}
    return {"vocab": 4096, "layers": 4, "hidden": 256, "heads": 4, "inter": 1024, "seqs": 64, "len": 128,
            "batch": 32}


@functools.lru_cache(maxsize=2)
def _data(vocab: int, seqs: int, length: int) -> dict[str, torch.Tensor]:
    g = _shared.generator(1)
    ids = torch.randint(5, vocab, (seqs, length), generator=g)
    types = torch.zeros(seqs, length, dtype=torch.long)
    mask = torch.zeros(seqs, length, dtype=torch.long)
    totals = torch.randint(length // 2, length + 1, (seqs,), generator=g)
    for i, total in enumerate(totals.tolist()):
        first = int(torch.randint(2, total - 2, (1,), generator=g))  # [CLS] + `first - 1` tokens + [SEP]
        ids[i, 0] = CLS
        ids[i, first] = SEP
        ids[i, total - 1] = SEP
        types[i, first + 1:total] = 1
        mask[i, :total] = 1
    ids = ids * mask
    return {"input_ids": ids, "token_type_ids": types * mask, "attention_mask": mask}


def data() -> dict[str, torch.Tensor]:
    c = config()
    return _data(c["vocab"], c["seqs"], c["len"])


def build_model() -> nn.Module:
    import transformers

    transformers.logging.set_verbosity_error()
    c = config()
    cfg = transformers.BertConfig(vocab_size=c["vocab"], hidden_size=c["hidden"], num_hidden_layers=c["layers"],
                                  num_attention_heads=c["heads"], intermediate_size=c["inter"],
                                  max_position_embeddings=512, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0, pad_token_id=0)
    with _shared.seeded(0):
        model = transformers.BertModel(cfg)
    return model.eval()


def _outputs(model: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    d, b = _shared.to_device(data(), _shared.device_of(model)), config()["batch"]
    outs = []
    with torch.no_grad():
        for i in range(0, len(d["input_ids"]), b):
            batch = {k: v[i:i + b] for k, v in d.items()}
            out = model(**batch)
            pooled_tokens = _shared.mean_pool(out.last_hidden_state.float(), batch["attention_mask"])
            outs.append((pooled_tokens, out.pooler_output.float()))
    return outs


def evaluate(model: nn.Module) -> float:
    """Mean of the cosine similarities (mean-pooled last_hidden_state, pooler_output) to the FP32 model's."""
    ref = _shared.reference(f"bert/{_shared.size()}", build_model, _outputs, _shared.device_of(model))
    tok = pool = 0.0
    count = 0
    for (r_tok, r_pool), (o_tok, o_pool) in zip(ref, _outputs(model)):
        s1, n = _shared.cosine_sum(r_tok, o_tok)
        s2, _ = _shared.cosine_sum(r_pool, o_pool)
        tok, pool, count = tok + s1, pool + s2, count + n
    return 0.5 * (tok + pool) / count


def example_inputs() -> dict[str, torch.Tensor]:
    return {k: v[:4].clone() for k, v in data().items()}

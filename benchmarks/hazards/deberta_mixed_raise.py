"""A mixed plan that makes the model's own code raise (bf16): a tiny DeBERTa-v2 (transformers' own code,
built from a config) masks its attention scores with `torch.finfo(query.dtype).min`, so a plan that keeps
`query_proj` FP32 with the attention matmul in bf16 raises ("value cannot be converted to type c10::BFloat16
without overflow"). Such a plan must count as failing, not end the tune. Metric: mean absolute error of the
logits relative to FP32's mean |logit| (lower is better).
"""
import torch
import transformers
from _hazard_common import metric
from torch import nn

TUNE = {"dtype": "bf16", "tolerance": 0.002, "absolute": True, "lower_is_better": True}
SPLIT = "heldout"


class Classifier(nn.Module):
    """The HF model with positional (input_ids, attention_mask) and its logits as the output."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(141)
        config = transformers.DebertaV2Config(vocab_size=200, hidden_size=32, num_hidden_layers=2,
                                              num_attention_heads=2, intermediate_size=64,
                                              max_position_embeddings=32, num_labels=3)
        self.model = transformers.DebertaV2ForSequenceClassification(config).eval()

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, attention_mask=mask).logits


def build_model() -> nn.Module:
    return Classifier().eval()


_IDS = torch.randint(1, 200, (12, 10), generator=torch.Generator().manual_seed(142))
_MASK = torch.ones_like(_IDS)
_MASK[::2, 7:] = 0
evaluate = metric(build_model, (_IDS, _MASK), "rel-mae")


def example_inputs():
    return (_IDS[:4], _MASK[:4])

"""An HF-like model file: forward takes keyword args, example_inputs() returns a dict, the output is a dataclass.

The output's first tensor is the integer `input_ids` (as in sentence-transformers' outputs), so an error
taken on the first tensor only would always be 0; the float tensors follow it.
"""
from dataclasses import dataclass

import torch
from torch import nn

VOCAB, DIM = 50, 16


@dataclass
class EncoderOutput:
    input_ids: torch.Tensor
    last_hidden_state: torch.Tensor
    pooled: torch.Tensor


class TinyEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.dense = nn.Linear(DIM, DIM)
        self.head = nn.Linear(DIM, 4)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> EncoderOutput:
        hidden = torch.tanh(self.dense(self.embed(input_ids)))  # FORWARD
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = self.head((hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0))
        return EncoderOutput(input_ids=input_ids, last_hidden_state=hidden, pooled=pooled)


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return TinyEncoder().eval()


def example_inputs() -> dict:
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, VOCAB, (3, 7), generator=g)
    attention_mask = torch.ones(3, 7, dtype=torch.long)
    attention_mask[1, 4:] = 0  # a padded row: the mask must reach forward
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def evaluate(model: nn.Module) -> float:
    with torch.no_grad():
        out = model(**example_inputs())
    return float(out.pooled.float().softmax(-1).max(-1).values.mean())

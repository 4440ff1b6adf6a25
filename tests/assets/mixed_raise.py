"""Test model file whose forward raises only under a mixed plan (as DeBERTa-v2's attention does).

The attention scores are masked with `torch.finfo(q.dtype).min`, the dtype of one tensor (the query
projection's output) applied to another (the scores of the matmul): in FP32, and with every op in bf16, the
two dtypes agree and the forward runs; with `query` FP32 and the matmul in bf16, float32's min does not fit
in bfloat16 and `masked_fill` raises ("value cannot be converted to type c10::BFloat16 without overflow").
The query projection must stay FP32 for the target (its output, ~1e3 minus its bias, is also returned: bf16's
rounding of ~1e3 cancels it), so the search's first guess keeps `query` FP32 and the matmul low, a plan that
raises: the search must learn that the matmul goes with it. evaluate() is the mean cosine similarity to the
FP32 outputs (higher is better).
"""
import torch
from torch import nn


class MaskedAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.query = nn.Linear(16, 16)
        self.key = nn.Linear(16, 16)
        self.head = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k = self.query(x), self.key(x)
        scores = torch.matmul(q, k.transpose(-1, -2))
        mask = torch.ones(x.shape[-2], x.shape[-2], dtype=torch.bool).triu(1)
        scores = scores.masked_fill(mask, torch.finfo(q.dtype).min)
        attended = self.head(torch.softmax(scores.float(), dim=-1) @ x)
        return torch.cat([attended.float(), q.float() - self.query.bias], dim=-1)


def build_model() -> nn.Module:
    torch.manual_seed(0)
    model = MaskedAttention()
    with torch.no_grad():
        model.query.weight.mul_(1e-2)
        model.query.bias.fill_(1e3)
    return model.eval()


_X = torch.randn(8, 6, 16, generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    _REF = build_model()(_X)


def example_inputs():
    return (_X[:2],)


def evaluate(model: nn.Module) -> float:
    with torch.no_grad():
        out = model(_X).float()
    return float(torch.nn.functional.cosine_similarity(out.flatten(1), _REF.flatten(1)).mean())

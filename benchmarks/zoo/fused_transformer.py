"""Zoo model: nn.TransformerEncoder on torch's fused fast path (padding mask, nested tensors); metric: cosine.

    mpt tune benchmarks/zoo/fused_transformer.py --dtype bf16 --tolerance 1e-4 --out runs/fused_transformer

An embedding, nn.TransformerEncoder(nn.TransformerEncoderLayer(d_model 128, 4 heads, feed-forward 512,
batch_first=True, dropout 0), 4 layers, enable_nested_tensor=True) called with a
src_key_padding_mask, and a linear head. In eval mode under no_grad torch runs each layer as one
fused ATen op (`_transformer_encoder_layer_fwd`) on a NestedTensor that drops the padded positions:
the fast path. torch takes it only when every weight of a layer has the dtype of its input, so a
plan that keeps part of a layer in FP32 meets it where torch decides which path to run. Seeded
init (torch's own, seed 0, then the embedding N(0, 1)), 0.9M parameters.

Data: 64 fixed token sequences of length 64 and random lengths (half to all of it; padding is token
0 and masked), 4 batches of 16. Metric: the mean cosine similarity, per non-padding position,
between the head's output and the FP32 model's (1.0 for the FP32 model; higher is better).

MPT_ZOO_SIZE=tiny: d_model 32, 2 heads, feed-forward 64, 2 layers, 8 sequences of length 16.
"""
from __future__ import annotations

import torch
from torch import nn

import _shared


def config() -> dict:
    if _shared.tiny():
        return {"vocab": 64, "d": 32, "heads": 2, "ff": 64, "layers": 2, "seqs": 8, "len": 16, "batch": 8}
    return {"vocab": 1000, "d": 128, "heads": 4, "ff": 512, "layers": 4, "seqs": 64, "len": 64, "batch": 16}


class Encoder(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, ff: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=True)
        self.head = nn.Linear(d, d)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.embed(tokens), src_key_padding_mask=mask == 0)
        return self.head(h)


def tokens() -> tuple[torch.Tensor, torch.Tensor]:
    c = config()
    return _shared.padded_tokens(c["vocab"], c["seqs"], c["len"])


def build_model() -> nn.Module:
    c = config()
    with _shared.seeded(0):
        model = Encoder(c["vocab"], c["d"], c["heads"], c["ff"], c["layers"])
        with torch.no_grad():
            nn.init.normal_(model.embed.weight, std=1.0)
    return model.eval()


def _outputs(model: nn.Module) -> list[torch.Tensor]:
    ids, mask = tokens()
    device = _shared.device_of(model)
    ids, mask = ids.to(device), mask.to(device)
    b = config()["batch"]
    with torch.no_grad():
        return [model(ids[i:i + b], mask[i:i + b]).float() for i in range(0, len(ids), b)]


def evaluate(model: nn.Module) -> float:
    """Mean cosine similarity, per non-padding position, of the output to the FP32 model's."""
    ref = _shared.reference(f"fused_transformer/{_shared.size()}", build_model, _outputs, _shared.device_of(model))
    _, mask = tokens()
    b = config()["batch"]
    total, count = 0.0, 0
    for i, (r, out) in enumerate(zip(ref, _outputs(model), strict=True)):
        keep = mask[i * b:(i + 1) * b].bool().to(r.device)
        s, n = _shared.cosine_sum(r[keep], out[keep])
        total, count = total + s, count + n
    return total / count


def example_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    ids, mask = tokens()
    return (ids[:4].clone(), mask[:4].clone())

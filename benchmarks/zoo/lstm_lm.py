"""Zoo model: an LSTM language model (embedding, 2-layer nn.LSTM, linear head); metric: top-1 agreement with FP32.

    mpt tune benchmarks/zoo/lstm_lm.py --dtype bf16 --tolerance 0.02 --out runs/lstm_lm

Vocabulary 2000, embedding 256, nn.LSTM(256, 512, num_layers=2, batch_first=True), head 512 -> 2000,
5.2M parameters, seeded init. On CPU, nn.LSTM runs as `mkldnn_rnn_layer`, which torch.autocast
(and mpt's torch-cpu preset) lowers to bf16; mpt sees the whole 2-layer call as one op instance
(`lstm:mkldnn_rnn_layer#0`), so the search has 2 candidates: the LSTM and the head. (mpt's FLOP
count leaves the LSTM out, so its "matmul/conv FLOPs in bf16" share only counts the head.)

A random LSTM with PyTorch's default init (uniform +-1/sqrt(hidden)) gives near-uniform next-token
distributions, on which every fidelity metric passes trivially. So the init is scaled: the
embedding is N(0, 1), the LSTM weights uniform +-4/sqrt(hidden) (gates saturate partly, the state
carries information over many steps), and the head N(0, 0.5): the logits have a std of about 2.4 and
a median top-1 probability of about 0.1 (200x 1/vocab). No training: building takes well under a
second and is bit-for-bit deterministic.

Data: 128 fixed token sequences of length 128 (seeded), 4 batches of 32. Metric: the share of the
16384 positions whose argmax next token equals the FP32 model's (1.0 for the FP32 model; higher is
better). About 0.5 s per evaluate on 2 cores.

MPT_ZOO_SIZE=tiny: vocabulary 64, embedding 16, hidden 32, 8 sequences of length 16.
"""
from __future__ import annotations

import functools

import torch
from torch import nn

import _shared


def config() -> dict:
    if _shared.tiny():
        return {"vocab": 64, "emb": 16, "hidden": 32, "layers": 2, "seqs": 8, "len": 16, "batch": 8}
    return {"vocab": 2000, "emb": 256, "hidden": 512, "layers": 2, "seqs": 128, "len": 128, "batch": 32}


class LSTMLM(nn.Module):
    def __init__(self, vocab: int, emb: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, emb)
        self.lstm = nn.LSTM(emb, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(tokens))
        return self.head(out)


@functools.lru_cache(maxsize=2)
def _tokens(vocab: int, seqs: int, length: int) -> torch.Tensor:
    return torch.randint(0, vocab, (seqs, length), generator=_shared.generator(1))


def tokens() -> torch.Tensor:
    c = config()
    return _tokens(c["vocab"], c["seqs"], c["len"])


def build_model() -> nn.Module:
    c = config()
    with _shared.seeded(0):
        model = LSTMLM(c["vocab"], c["emb"], c["hidden"], c["layers"])
        k = 4.0 / c["hidden"] ** 0.5
        with torch.no_grad():
            nn.init.normal_(model.embed.weight, std=1.0)
            for p in model.lstm.parameters():
                nn.init.uniform_(p, -k, k)
            nn.init.normal_(model.head.weight, std=0.5)
            nn.init.zeros_(model.head.bias)
    return model.eval()


def _logits(model: nn.Module) -> list[torch.Tensor]:
    return _shared.batched(model, tokens(), config()["batch"])


def evaluate(model: nn.Module) -> float:
    """Share of positions whose most likely next token matches the FP32 model's."""
    ref = _shared.reference(f"lstm_lm/{_shared.size()}", build_model, _logits, _shared.device_of(model))
    return _shared.agreement(ref, _logits(model))


def example_inputs() -> tuple[torch.Tensor]:
    return (tokens()[:4].clone(),)

"""A LLaMA-shaped causal LM for `benchmarks/scale.py`, as an mpt model file (random init, seeded, no download).

The shape is TinyLlama-1.1B's (hidden 2048, MLP 5632, 32 heads, 4 key/value heads, vocab 32000, 22 layers)
unless the environment says otherwise: MPT_SCALE_LAYERS, MPT_SCALE_HIDDEN, MPT_SCALE_MLP, MPT_SCALE_VOCAB,
MPT_SCALE_TOKENS (tokens per batch), MPT_SCALE_BATCHES (batches per evaluate). Under torchrun with
MPT_SCALE_SHARD=fsdp, build_model() shards every layer and the root with FSDP2 over a CPU mesh of every rank
(gloo), and evaluate() splits the batches over the ranks and all-reduces the counts. Written in plain torch (RMSNorm,
rotary embeddings, grouped-query attention through SDPA, SwiGLU) so it needs no transformers install.

`evaluate` is next-token top-1 agreement with the FP32 model over MPT_SCALE_BATCHES batches: the first call
(mpt's FP32 baseline) keeps its predictions as the reference, so no second model is ever built. The time
spent in `build_model()` and `evaluate()` is appended to MPT_SCALE_TIMES (a JSON-lines file) so the
benchmark can tell the user's time from mpt's own without trusting mpt's accounting.
"""
from __future__ import annotations

import json
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def _env(name: str, default: int) -> int:
    return int(os.environ.get(f"MPT_SCALE_{name}", default))


LAYERS, HIDDEN, MLP, VOCAB = _env("LAYERS", 22), _env("HIDDEN", 2048), _env("MLP", 5632), _env("VOCAB", 32000)
HEADS, KV_HEADS = max(1, HIDDEN // 64), max(1, HIDDEN // 512)
TOKENS, BATCHES = _env("TOKENS", 64), _env("BATCHES", 4)


def _log(kind: str, seconds: float) -> None:
    path = os.environ.get("MPT_SCALE_TIMES")
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps({"kind": kind, "seconds": seconds, "pid": os.getpid()}) + "\n")


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * self.weight


def rotary(x, positions):
    half = x.shape[-1] // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=x.device) / half)
    angles = positions[:, None].float() * freqs[None]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head_dim = HIDDEN // HEADS
        self.q_proj = nn.Linear(HIDDEN, HEADS * self.head_dim, bias=False)
        self.k_proj = nn.Linear(HIDDEN, KV_HEADS * self.head_dim, bias=False)
        self.v_proj = nn.Linear(HIDDEN, KV_HEADS * self.head_dim, bias=False)
        self.o_proj = nn.Linear(HEADS * self.head_dim, HIDDEN, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        pos = torch.arange(t, device=x.device)
        q = rotary(self.q_proj(x).view(b, t, HEADS, self.head_dim).transpose(1, 2), pos)
        k = rotary(self.k_proj(x).view(b, t, KV_HEADS, self.head_dim).transpose(1, 2), pos)
        v = self.v_proj(x).view(b, t, KV_HEADS, self.head_dim).transpose(1, 2)
        k = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
        v = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class MLPBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(HIDDEN, MLP, bias=False)
        self.up_proj = nn.Linear(HIDDEN, MLP, bias=False)
        self.down_proj = nn.Linear(MLP, HIDDEN, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(HIDDEN)
        self.self_attn = Attention()
        self.post_attention_layernorm = RMSNorm(HIDDEN)
        self.mlp = MLPBlock()

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.norm = RMSNorm(HIDDEN)
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def build_model() -> nn.Module:
    t0 = time.monotonic()
    torch.manual_seed(0)
    model = LlamaLM()
    with torch.no_grad():  # a trained model's spread: small init keeps the residual stream sane at depth
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.02 if "embed" in name else 0.02 / math.sqrt(2 * LAYERS))
    model.eval()
    if _sharded():
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    _log("build", time.monotonic() - t0)
    return model


def _sharded() -> bool:
    return os.environ.get("MPT_SCALE_SHARD") == "fsdp" and dist.is_initialized()


def _batches() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (1, TOKENS), generator=g) for _ in range(BATCHES)]


def example_inputs():
    return (_batches()[0],)


_REFERENCE: list[torch.Tensor] = []  # the FP32 model's predictions: from the first evaluate (mpt's baseline)


def evaluate(model) -> float:
    t0 = time.monotonic()
    agree = total = 0
    rank, size = (dist.get_rank(), dist.get_world_size()) if _sharded() else (0, 1)
    batches = _batches()[rank::size]
    with torch.no_grad():
        device = next(model.parameters()).device  # mpt tune --device cuda moved the model there
        for i, x in enumerate(batches):
            pred = model(x.to(device)).argmax(-1)
            if len(_REFERENCE) <= i:
                _REFERENCE.append(pred)
            agree += int((pred == _REFERENCE[i]).sum())
            total += pred.numel()
        if size > 1:  # every rank returns the same metric
            counts = torch.tensor([agree, total], dtype=torch.float64)
            dist.all_reduce(counts)
            agree, total = int(counts[0]), int(counts[1])
    _log("evaluate", time.monotonic() - t0)
    return agree / total

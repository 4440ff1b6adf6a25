"""The rotary-embedding forwards of transformers' Llama (and Mistral, Qwen2...) as its releases write them, pinned.

A model's code decides where torch.autocast is off, and releases differ in how (issue 44):

- 4.40 to 4.57: an unconditional `with torch.autocast(device_type=device_type, enabled=False)` around the matmul;
- 5.x up to 5.17 at least: `with maybe_autocast(device_type=device_type, enabled=False)`, which opens that block
  only when autocast is already on for the device at the call and a `nullcontext()` otherwise (`maybe_autocast`
  below is 5.17's `transformers.utils.generic.maybe_autocast`, as written there);
- 5.24: no block at all, the frequencies computed elementwise.

`TinyDecoder` is a two-layer decoder with such a rotary embedding (as `LlamaRotaryEmbedding` computes it) and
linear layers around it; `patch_llama(monkeypatch, release)` gives the installed transformers' Llama rotary the
forward of `release`.
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn


def maybe_autocast(device_type: str, dtype: torch.dtype | None = None, enabled: bool = True,
                   cache_enabled: bool | None = None) -> Any:
    """transformers 5.17's `maybe_autocast` (utils/generic.py), its body as written there."""
    if device_type == "meta":
        return nullcontext()
    if torch.is_autocast_enabled(device_type) or enabled:
        return torch.autocast(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
    else:
        return nullcontext()


def _device_type(x: torch.Tensor) -> str:
    return x.device.type if isinstance(x.device.type, str) and x.device.type != "mps" else "cpu"


def forward_4_57(self: Any, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """LlamaRotaryEmbedding.forward of transformers 4.40-4.57 (the decorators left out)."""
    inv_freq_expanded = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1).to(x.device)
    position_ids_expanded = position_ids[:, None, :].float()
    device_type = _device_type(x)
    with torch.autocast(device_type=device_type, enabled=False):  # Force float32
        freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
    return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def forward_5_17(self: Any, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """LlamaRotaryEmbedding.forward of transformers 5.17 (the decorators left out)."""
    inv_freq_expanded = (
        self.inv_freq[None, :, None].expand(position_ids.shape[0], -1, 1).to(dtype=torch.float, device=x.device)
    )
    position_ids_expanded = position_ids[:, None, :].float()
    device_type = _device_type(x)
    # Disable any outside autocast context if any, to really force fp32
    with maybe_autocast(device_type=device_type, enabled=False):
        freqs = (inv_freq_expanded @ position_ids_expanded).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
    return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def forward_5_24(self: Any, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """LlamaRotaryEmbedding.forward of transformers 5.24 (the decorators left out)."""
    freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = emb.cos() * self.attention_scaling
    sin = emb.sin() * self.attention_scaling
    return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


RELEASES: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
    "4.57": forward_4_57, "5.17": forward_5_17, "5.24": forward_5_24}


class Rotary(nn.Module):
    def __init__(self, dim: int, release: str) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)),
                             persistent=False)
        self.attention_scaling = 1.0
        self.release = release

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return RELEASES[self.release](self, x, position_ids)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Layer(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q, k = self.q(h), self.k(h)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        att = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
        h = h + self.o(att @ self.v(h))
        return h + self.down(torch.relu(self.up(h)))


class TinyDecoder(nn.Module):
    """Embedding, a rotary embedding as `release` writes it, two layers and a head."""

    def __init__(self, release: str, dim: int = 16, vocab: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rotary_emb = Rotary(dim, release)
        self.layers = nn.ModuleList(Layer(dim) for _ in range(2))
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        positions = torch.arange(ids.shape[1], device=ids.device)[None].expand(ids.shape[0], -1)
        cos, sin = self.rotary_emb(h, positions)
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.head(h)


def patch_llama(monkeypatch: Any, release: str) -> None:
    """The installed transformers' LlamaRotaryEmbedding computes as `release` writes it."""
    from transformers.models.llama import modeling_llama

    monkeypatch.setattr(modeling_llama.LlamaRotaryEmbedding, "forward", RELEASES[release])

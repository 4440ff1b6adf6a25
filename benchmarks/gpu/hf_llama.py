"""A LLaMA-shaped Hugging Face decoder for `benchmarks/gpu_tune.py`: `transformers.LlamaForCausalLM` built from a
config with random seeded init, directly on the device (no download, no folder of weights on disk).

The shape comes from MPT_GPU_SHAPE: `1b` (TinyLlama-1.1B: hidden 2048, 22 layers, 32 heads, 4 key/value
heads, vocab 32000), `8b` (Llama-3-8B: hidden 4096, 32 layers, 32 heads, 8 key/value heads, vocab 128256) or
`tiny` (a smoke run on a CPU); MPT_GPU_DEVICE says where it is built (default cuda). mpt tunes it as a model
file with a built-in metric (`--metric kl --data ...`), so it needs only `build_model()`.
"""
from __future__ import annotations

import os

import torch

SHAPES = {
    "tiny": dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512),
    "1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
               num_key_value_heads=4, vocab_size=32000),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256),
}


def config():
    from transformers import LlamaConfig

    return LlamaConfig(**SHAPES[os.environ.get("MPT_GPU_SHAPE", "tiny")], max_position_embeddings=4096,
                       rope_theta=500000.0, tie_word_embeddings=False)


def build_model() -> torch.nn.Module:
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device(os.environ.get("MPT_GPU_DEVICE", "cuda")):
        model = LlamaForCausalLM(config())
    return model.eval()

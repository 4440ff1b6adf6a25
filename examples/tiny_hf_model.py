"""Save a tiny Hugging Face BERT masked-LM folder and its calibration inputs, for `mpt tune hf:DIR`.

    python examples/tiny_hf_model.py runs/tiny-bert
    mpt tune hf:runs/tiny-bert --metric agreement --data runs/tiny-bert/calibration.safetensors

The folder is what `save_pretrained` writes (config.json, model.safetensors), with seeded random weights
(2 layers, hidden 32, a 500-token vocabulary), and `calibration.safetensors` holds 32 token sequences
(`input_ids`, `attention_mask`: the forward's keyword arguments; dim 0 is the sample). Needs transformers
(`pip install -c .ci/constraints.txt -e ".[hf]"`).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import BertConfig, BertForMaskedLM
from transformers.utils import logging as hf_logging


def main(out: str) -> None:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=500, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    hf_logging.disable_progress_bar()  # a one-shard "Writing model shards" bar would land after the line below
    BertForMaskedLM(config).save_pretrained(out)
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(1, 500, (32, 24), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1::2, 16:] = 0  # every other sequence is padded: those tokens are not compared
    save_file({"input_ids": input_ids, "attention_mask": attention_mask}, str(Path(out) / "calibration.safetensors"))
    print(f"wrote {out}/ (config.json, model.safetensors, calibration.safetensors)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/tiny-bert")

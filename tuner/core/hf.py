"""`hf:PATH`: a Hugging Face model folder saved with `save_pretrained`, tuned with no model file.

Never the network: HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE are set before transformers is imported and every
`from_pretrained` passes `local_files_only=True`. The class is the first of `config.architectures` that
transformers has (`BertForMaskedLM`), else `AutoModel`. A sentence-transformers folder (`modules.json`)
is loaded with `SentenceTransformer` when that package is importable; its output is `sentence_embedding`.
"""
from __future__ import annotations

import os
import types
from pathlib import Path
from typing import Any

import torch

from tuner.core.errors import ConfigError
from tuner.core.hf_config import architecture

__all__ = ["offline_transformers", "build_hf_model", "hf_forward", "SentenceEncoder", "is_sentence_transformers"]

INSTALL_HINT = ("pip install -c constraints.txt 'transformers>=5.24' (constraints.txt pinning your torch, e.g. "
                "torch==2.13.0, so pip keeps it)")


def offline_transformers() -> types.ModuleType:
    """transformers, imported with the hub switched off; ConfigError saying how to install it when absent."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    try:
        import transformers
    except ImportError:
        raise ConfigError(f"hf: models need transformers, which is not installed: {INSTALL_HINT}") from None
    transformers.utils.logging.set_verbosity_error()  # mpt says what it loads; no download bars or notices
    transformers.utils.logging.disable_progress_bar()
    return transformers


def _sentence_transformers(folder: Path) -> Any:
    if not (folder / "modules.json").is_file():
        return None
    try:
        import sentence_transformers
    except ImportError:
        return None
    return sentence_transformers


def is_sentence_transformers(folder: Path) -> bool:
    """Whether `build_hf_model(folder)` builds a SentenceTransformer (wrapped) rather than a transformers class:
    its module names are then sentence-transformers', which no `from_pretrained` reads."""
    return _sentence_transformers(folder) is not None


class SentenceEncoder(torch.nn.Module):
    """A SentenceTransformer called with a tokenizer's keyword arguments (its forward takes one dict)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, **features: torch.Tensor) -> Any:
        return self.model(dict(features))


def hf_forward(folder: Path) -> tuple[Any, str] | None:
    """(the forward `build_hf_model(folder)` will call, its name) without loading the weights, so a data file's
    tensor names are checked before anything is built or written; None when only the built model tells
    (`AutoModel` picks its class from the config)."""
    transformers = offline_transformers()
    if _sentence_transformers(folder) is not None:
        return SentenceEncoder.forward, "a sentence-transformers model's forward"
    arch = architecture(folder)
    cls = getattr(transformers, arch, None) if arch else None
    if cls is None or not hasattr(cls, "from_pretrained"):
        return None
    return cls.forward, f"{cls.__name__}.forward"


def build_hf_model(folder: Path) -> torch.nn.Module:
    """The FP32 model of a saved folder, in eval mode."""
    transformers = offline_transformers()
    st = _sentence_transformers(folder)
    if st is not None:
        return SentenceEncoder(st.SentenceTransformer(str(folder), device="cpu", local_files_only=True)).eval()
    arch = architecture(folder)
    cls = getattr(transformers, arch, None) if arch else None
    if cls is None or not hasattr(cls, "from_pretrained"):
        cls = transformers.AutoModel
    major = int(str(transformers.__version__).split(".")[0])
    dtype_key = "dtype" if major >= 5 else "torch_dtype"  # transformers 5 renamed it (and loads "auto" by default)
    try:
        model = cls.from_pretrained(str(folder), local_files_only=True, **{dtype_key: torch.float32})
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load {folder} with {cls.__name__}: {str(exc).splitlines()[0]}") from None
    return model.eval()

"""`hf:PATH` specs and what a saved model folder's config says, read without importing torch or transformers
(the options check them before anything heavy is imported)."""
from __future__ import annotations

import json
from pathlib import Path

from tuner.core.errors import ConfigError

__all__ = ["HF_PREFIX", "is_hf_spec", "hf_folder", "hf_files", "architecture", "default_metric_name"]

HF_PREFIX = "hf:"


def is_hf_spec(spec: str | None) -> bool:
    return isinstance(spec, str) and spec.startswith(HF_PREFIX)


def hf_folder(spec: str) -> Path:
    """The folder of `hf:PATH`; ConfigError (exit 2) when it is not a saved model folder."""
    text = spec[len(HF_PREFIX):]
    folder = Path(text).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"model folder not found: {text} (hf:PATH takes a local folder saved with "
                          "save_pretrained)")
    if not (folder / "config.json").is_file():
        raise ConfigError(f"{text} has no config.json: not a folder saved with save_pretrained")
    return folder.resolve()


def hf_files(folder: Path) -> tuple[Path, ...]:
    """The folder's files that define the model's code and config (fingerprinted as the model's source)."""
    return tuple(p for p in (folder / "config.json", folder / "modules.json") if p.is_file())


def architecture(folder: Path) -> str | None:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise ConfigError(f"{folder / 'config.json'} is not readable JSON") from None
    names = config.get("architectures") if isinstance(config, dict) else None
    return next((n for n in names if isinstance(n, str)), None) if isinstance(names, list) else None


def default_metric_name(spec: str) -> str:
    """agreement for a model with a head (`...ForMaskedLM`, `...ForSequenceClassification`), cosine for an
    encoder (`BertModel`) or a sentence-transformers folder."""
    folder = hf_folder(spec)
    arch = architecture(folder) or ""
    head = "For" in arch and not (folder / "modules.json").is_file()
    return "agreement" if head else "cosine"

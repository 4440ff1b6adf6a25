"""`hf:PATH` specs and what a saved model folder's config says, read without importing torch or transformers
(the options check them before anything heavy is imported)."""
from __future__ import annotations

import json
import re
from pathlib import Path

from tuner.core.errors import ConfigError

__all__ = ["HF_PREFIX", "is_hf_spec", "hf_folder", "hf_files", "architecture", "outputs_scores",
           "default_metric_name"]

HF_PREFIX = "hf:"


def is_hf_spec(spec: str | None) -> bool:
    return isinstance(spec, str) and spec.startswith(HF_PREFIX)


def hf_folder(spec: str) -> Path:
    """The folder of `hf:PATH`; ConfigError (exit 2) when it is not a saved model folder."""
    text = spec[len(HF_PREFIX):]
    folder = Path(text).expanduser()
    if folder.is_file() and (folder.parent / "config.json").is_file():
        raise ConfigError(f"hf:PATH takes the folder saved with save_pretrained, not a file in it: pass the "
                          f"folder: {HF_PREFIX}{Path(text).parent}")
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


# Classes whose `logits` are scores over a vocabulary or over classes, by transformers' naming: the task heads
# `...ForCausalLM`, `...ForMaskedLM`, `...ForConditionalGeneration`, `...ForSequenceClassification`, ... and the
# older LM heads without "For" (`GPT2LMHeadModel`, `XLMWithLMHeadModel`, `GPT2DoubleHeadsModel`). Heads whose
# output is no such score (`...ForQuestionAnswering` spans, `...ForDepthEstimation`, segmentation maps) are not.
_SCORES = re.compile(r"(For\w*(LM|Classification|Generation|MultipleChoice|PreTraining|NextSentencePrediction|CTC)"
                     r"|LMHeadModel|WithLMHead|DoubleHeadsModel)$")


def outputs_scores(arch: str) -> bool:
    """Whether class `arch`'s output is logits over a vocabulary or classes (what agreement compares)."""
    return bool(_SCORES.search(arch))


def default_metric_name(spec: str) -> str:
    """agreement for a model whose output is logits over a vocabulary or classes (`BertForMaskedLM`,
    `GPT2LMHeadModel`, `...ForSequenceClassification`), where the top answer is what the user sees; cosine for
    any other output: an encoder (`BertModel`), a sentence-transformers folder, a regression or span head."""
    folder = hf_folder(spec)
    arch = architecture(folder) or ""
    scores = outputs_scores(arch) and not (folder / "modules.json").is_file()
    return "agreement" if scores else "cosine"

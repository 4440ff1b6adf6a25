"""`hf:PATH` specs and what a saved model folder's config says, read without importing torch or transformers
(the options check them before anything heavy is imported)."""
from __future__ import annotations

import ast
import functools
import importlib.util
import json
import re
from pathlib import Path

from tuner.core.errors import ConfigError

__all__ = ["HF_PREFIX", "is_hf_spec", "hf_folder", "hf_files", "architecture", "is_encoder_decoder",
           "outputs_scores", "default_metric_name"]

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


def _config(folder: Path) -> object:
    try:
        return json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise ConfigError(f"{folder / 'config.json'} is not readable JSON") from None


def architecture(folder: Path) -> str | None:
    config = _config(folder)
    names = config.get("architectures") if isinstance(config, dict) else None
    return next((n for n in names if isinstance(n, str)), None) if isinstance(names, list) else None


def is_encoder_decoder(folder: Path) -> bool:
    """Whether the saved model is an encoder-decoder (its logits are the decoder's: `is_encoder_decoder`)."""
    config = _config(folder)
    return isinstance(config, dict) and config.get("is_encoder_decoder") is True


def vocab_size(folder: Path) -> int | None:
    """The vocabulary size the saved config states (top level, or its text model's or decoder's); None if none."""
    config = _config(folder)
    parts = (config, config.get("text_config"), config.get("decoder")) if isinstance(config, dict) else ()
    for part in parts:
        size = part.get("vocab_size") if isinstance(part, dict) else None
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            return size
    return None


# transformers' own list of which class serves which task (`models/auto/modeling_auto.py`), read as text so
# that the options check imports neither torch nor transformers. A class listed under one of these tasks outputs
# scores over a vocabulary or classes (per sample, per token or per pixel); one listed under other tasks only
# (`MODEL_MAPPING_NAMES`: the bare encoders; question answering's spans, depth maps) outputs no such score.
_SCORE_TASKS = frozenset(f"MODEL_FOR_{task}_MAPPING_NAMES" for task in (
    "CAUSAL_LM", "MASKED_LM", "SEQ_TO_SEQ_CAUSAL_LM", "SPEECH_SEQ_2_SEQ", "PRETRAINING", "SEQUENCE_CLASSIFICATION",
    "TOKEN_CLASSIFICATION", "MULTIPLE_CHOICE", "NEXT_SENTENCE_PREDICTION", "IMAGE_CLASSIFICATION",
    "SEMANTIC_SEGMENTATION", "AUDIO_CLASSIFICATION", "AUDIO_FRAME_CLASSIFICATION", "CTC", "VIDEO_CLASSIFICATION",
    "TIME_SERIES_CLASSIFICATION", "IMAGE_TEXT_TO_TEXT", "MULTIMODAL_LM"))

# The fallback for a class transformers' lists do not name (a newer or older transformers, a custom class), by
# transformers' naming: the task heads `...ForCausalLM`, `...ForMaskedLM`, `...ForConditionalGeneration`,
# `...ForSequenceClassification`, `...ForSemanticSegmentation`, ... and the older LM heads without "For"
# (`GPT2LMHeadModel`, `XLMWithLMHeadModel`, `GPT2DoubleHeadsModel`, `MarianMTModel`).
_SCORES = re.compile(r"(For\w*(LM|Classification|Generation|MultipleChoice|PreTraining|NextSentencePrediction|CTC"
                     r"|Segmentation)|LMHeadModel|WithLMHead|DoubleHeadsModel|MTModel)$")


# Pretraining heads that reconstruct their input (masked patches of pixels, speech features) output no scores.
_RECONSTRUCTS = re.compile(r"MAE|Hiera|Wav2Vec2|UniSpeech")


def _scores_in(task: str, name: str) -> bool:
    if task == "MODEL_FOR_PRETRAINING_MAPPING_NAMES":
        return not _RECONSTRUCTS.search(name)
    return task in _SCORE_TASKS


@functools.lru_cache(maxsize=1)
def _task_classes() -> dict[str, bool]:
    """Each class transformers' auto mappings name -> whether one of its tasks outputs scores; {} when
    transformers is not installed or its file reads otherwise."""
    try:
        spec = importlib.util.find_spec("transformers")
        if spec is None or spec.origin is None:
            return {}
        tree = ast.parse((Path(spec.origin).parent / "models" / "auto" / "modeling_auto.py").read_text("utf-8"))
    except (OSError, ValueError, SyntaxError, ImportError):
        return {}
    classes: dict[str, bool] = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.Call)
                and node.value.args):
            continue
        target = node.targets[0]
        if not (isinstance(target, ast.Name) and target.id.endswith("_MAPPING_NAMES")):
            continue
        try:
            pairs = ast.literal_eval(node.value.args[0])
        except (ValueError, TypeError, SyntaxError):
            continue
        for pair in pairs if isinstance(pairs, (list, tuple)) else ():
            names = pair[1] if isinstance(pair, tuple) and len(pair) == 2 else ()
            for name in names if isinstance(names, (tuple, list)) else (names,):
                if isinstance(name, str):
                    classes[name] = classes.get(name, False) or _scores_in(target.id, name)
    return classes


def outputs_scores(arch: str) -> bool:
    """Whether class `arch`'s output is logits over a vocabulary or classes (what agreement compares): by the
    tasks transformers lists the class under (`MarianMTModel` is a sequence-to-sequence LM whatever its name
    says), else by its name."""
    listed = _task_classes().get(arch)
    return bool(_SCORES.search(arch)) if listed is None else listed


def default_metric_name(spec: str) -> str:
    """agreement for a model whose output is logits over a vocabulary or classes (`BertForMaskedLM`,
    `GPT2LMHeadModel`, `MarianMTModel`, `...ForSequenceClassification`, `SegformerForSemanticSegmentation`,
    `ElectraForPreTraining`), where the top answer is what the user sees; cosine for any other output: an
    encoder (`BertModel`), a sentence-transformers folder, a regression or span head."""
    folder = hf_folder(spec)
    arch = architecture(folder) or ""
    scores = outputs_scores(arch) and not (folder / "modules.json").is_file()
    return "agreement" if scores else "cosine"

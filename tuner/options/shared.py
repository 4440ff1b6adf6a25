"""Options several commands take, each defined once, and the rules over several options.

A helper returns a fresh field (a dataclass field belongs to one class);
where commands differ (a default, the help), the helper takes it.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from tuner.core.dtypes import LOWER_CHOICES
from tuner.options.fields import Kind, option

DEFAULT_PRESET = {"cpu": "torch-cpu", "cuda": "torch-cuda"}  # the preset a device gets when none is named
DEVICES = tuple(DEFAULT_PRESET)
MODEL_METAVAR = "MODEL.py[:build_fn]"
FUNCTION_METAVAR = "NAME|FILE.py:NAME"


def model_option(*, positional: bool, help: str, required: str | None = None) -> Any:  # noqa: A002
    return option(None, help, Kind.MODEL_FILE, metavar=MODEL_METAVAR, positional=positional, required=required)


def build_option() -> Any:
    return option(None, "Model builder build_model() -> nn.Module (default: build_model).", Kind.FUNCTION,
                  metavar=FUNCTION_METAVAR)


def eval_option() -> Any:
    return option(None, "Metric function evaluate(model) -> float (default: evaluate).", Kind.FUNCTION,
                  metavar=FUNCTION_METAVAR)


def inputs_option() -> Any:
    return option(None, "Function giving example inputs (default: example_inputs).", Kind.FUNCTION,
                  metavar=FUNCTION_METAVAR)


METRICS = ("agreement", "cosine", "kl", "rel-error", "loss", "perplexity")  # tuner.measure.fidelity.Metric's values
LOSS_METRICS = ("loss", "perplexity")  # the model's own next-token loss: lower is better, relative tolerance


def data_option() -> Any:
    return option(None, "Calibration inputs for a built-in --metric (and for an hf: model): a .safetensors file or "
                  ".pt tensors named as the forward's arguments (dim 0 = samples), or a .jsonl file of texts "
                  "(with --tokenizer).", Kind.PATH, metavar="FILE")


def tokenizer_option() -> Any:
    return option(None, "Tokenizer folder for a .jsonl --data file (default: the hf: model's folder).", Kind.PATH,
                  metavar="DIR")


def batch_size_option() -> Any:
    return option(8, "Samples per forward call when cutting --data into batches.", Kind.INT, minimum=1, metavar="N")


def dtype_option(default: str | None) -> Any:
    return option(default, "Lower precision to use (bf16/bfloat16 or fp16/float16/half).", Kind.CHOICE,
                  choices=LOWER_CHOICES)


def preset_option() -> Any:
    return option(None, "Op-list preset (see `mpt presets`). Default: torch-cpu; torch-cuda for `mpt tune --device "
                  "cuda`. torch-cpu is torch.autocast's CPU list: matmuls/convs in the lower dtype, where "
                  "AVX512-BF16/AMX give the speed; other ops follow their inputs.", Kind.PRESET, metavar="NAME")


def device_option() -> Any:
    return option("cpu", "Where to run the model; a dtype the device cannot run is refused before any evaluation.",
                  Kind.CHOICE, choices=DEVICES)


def tolerance_option(default: float | None, help: str) -> Any:  # noqa: A002
    return option(default, help, Kind.NUMBER, minimum=0, metavar="X")


def json_option() -> Any:
    return option(False, "Print one JSON document for scripts instead of the table or verdict line.", Kind.BOOL)


# --- rules over several options: the options classes and the config file check both apply these ---------------

def tolerance_problem(tolerance: float, absolute: bool) -> str | None:
    """Why a tolerance that is a number >= 0 cannot be used (None when it can): a relative one must be below 1."""
    if not absolute and tolerance >= 1:
        return f"tolerance: a relative tolerance must be below 1 (0.01 = 1%), found {tolerance!r}"
    return None


def tolerance_rule(values: Mapping[str, Any], bad: Collection[str] = ()) -> list[tuple[str, str]]:
    """The tolerance against `absolute` (absent: false), where both passed their own checks."""
    tolerance = values.get("tolerance")
    if tolerance is None or {"tolerance", "absolute"} & set(bad):
        return []
    problem = tolerance_problem(tolerance, bool(values.get("absolute", False)))
    return [("tolerance", problem + "; set `absolute` for an absolute drop")] if problem else []


def resume_rule(values: Mapping[str, Any], bad: Collection[str] = ()) -> list[tuple[str, str]]:
    if values.get("resume") and values.get("overwrite"):
        return [("resume and overwrite", "resume and overwrite: give one of them, not both")]
    return []

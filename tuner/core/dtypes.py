"""The one dtype alias table: every user-facing dtype string goes through here.

Importable without torch: the options of every command are checked against
this table before the CLI imports torch (`mpt` prints its first line first).
The table names dtypes by their short names; torch's dtype objects are
looked up when a caller asks for one.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

_ALIASES: dict[str, str] = {  # every accepted spelling -> its short name
    "bf16": "bf16",
    "bfloat16": "bf16",
    "torch.bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "torch.float16": "fp16",
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "torch.float32": "fp32",
}
_TORCH_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64"}
_SHORT = {torch_name: short for short, torch_name in _TORCH_NAMES.items()}
LOWER_NAMES = ("bf16", "fp16")
# What `--dtype` and the `dtype` config key accept: the short names, then the other plain spellings.
LOWER_CHOICES = (*LOWER_NAMES, *(a for a, s in _ALIASES.items() if s in LOWER_NAMES and a != s and "." not in a))


def _is_torch_dtype(value: Any) -> bool:
    return type(value).__module__ == "torch" and type(value).__name__ == "dtype"


def parse_dtype(value: str | torch.dtype, *, lower_only: bool = False) -> torch.dtype:
    """Turn `bf16`/`bfloat16`/`fp16`/`half`/`fp32` (or a torch.dtype) into a torch.dtype.

    Case and surrounding spaces are ignored. With `lower_only`, only bf16 and
    fp16 are accepted (a plan's or a search's lower dtype). Raises ValueError
    naming the accepted spellings; callers turn it into a ConfigError where
    the value came from the user. torch is imported here, not with the module,
    so the CLI can list the dtype choices before torch loads.
    """
    import torch

    if _is_torch_dtype(value):
        dtype: torch.dtype = value  # type: ignore[assignment]
    elif isinstance(value, str) and value.strip().lower() in _ALIASES:
        dtype = getattr(torch, _TORCH_NAMES[_ALIASES[value.strip().lower()]])
    else:
        choices = "bf16, fp16" if lower_only else "bf16, fp16, fp32"
        raise ValueError(f"unknown dtype {value!r}: expected one of {choices} (or bfloat16, float16, half, float32)")
    if lower_only and short_name(dtype) not in LOWER_NAMES:
        raise ValueError(f"dtype {short_name(dtype)} is not a lower precision: expected bf16 or fp16")
    return dtype


def lower_name(value: Any) -> Any:
    """The short name (`bf16`, `fp16`) of any spelling of a lower dtype, a torch.dtype included; other values as
    they are (for the caller's check to refuse)."""
    text = str(value) if _is_torch_dtype(value) else value
    if isinstance(text, str) and _ALIASES.get(text.strip().lower()) in LOWER_NAMES:
        return _ALIASES[text.strip().lower()]
    return value


def short_name(dtype: torch.dtype | None) -> str:
    """`torch.bfloat16` -> `bf16`; other dtypes print without the `torch.` prefix."""
    if dtype is None:
        return "-"
    name = str(dtype).replace("torch.", "")
    return _SHORT.get(name, name)

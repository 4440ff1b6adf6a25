"""The one dtype alias table: every user-facing dtype string goes through here."""
from __future__ import annotations

import torch

_ALIASES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "torch.bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "half": torch.float16,
    "float16": torch.float16,
    "torch.float16": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
    "torch.float32": torch.float32,
}
_SHORT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64"}
LOWER_DTYPES = (torch.bfloat16, torch.float16)


def parse_dtype(value: str | torch.dtype, *, lower_only: bool = False) -> torch.dtype:
    """Turn `bf16`/`bfloat16`/`fp16`/`half`/`fp32` (or a torch.dtype) into a torch.dtype.

    Case and surrounding spaces are ignored. With `lower_only`, only bf16 and
    fp16 are accepted (a plan's or a search's lower dtype). Raises ValueError
    naming the accepted spellings; callers turn it into a ConfigError where
    the value came from the user.
    """
    if isinstance(value, torch.dtype):
        dtype = value
    elif isinstance(value, str) and value.strip().lower() in _ALIASES:
        dtype = _ALIASES[value.strip().lower()]
    else:
        choices = "bf16, fp16" if lower_only else "bf16, fp16, fp32"
        raise ValueError(f"unknown dtype {value!r}: expected one of {choices} (or bfloat16, float16, half, float32)")
    if lower_only and dtype not in LOWER_DTYPES:
        raise ValueError(f"dtype {short_name(dtype)} is not a lower precision: expected bf16 or fp16")
    return dtype


def short_name(dtype: torch.dtype | None) -> str:
    """`torch.bfloat16` -> `bf16`; other dtypes print without the `torch.` prefix."""
    if dtype is None:
        return "-"
    return _SHORT.get(dtype, str(dtype).replace("torch.", ""))

"""A policy's settings beyond its op lists, as enums: `unlisted:`, `inplace:` and `native:`.

Their values are what preset files hold, so a Policy read from YAML and written
back (`Policy.to_dict`) gives the same text; code compares members, never strings.
"""
from __future__ import annotations

from enum import Enum


class _Setting(str, Enum):
    """A str-valued setting: `str()` and f-strings show the value, as the preset file writes it."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def choices(cls) -> tuple[str, ...]:
        """The values a preset file may give, in declaration order (for error messages)."""
        return tuple(m.value for m in cls)


class UnlistedMode(_Setting):
    """What decides the precision of an op no list names (`unlisted:`)."""

    PASSTHROUGH = "passthrough"  # run as the inputs come (torch.autocast)
    FIRST_INPUT = "first_input"  # cast to the first floating-point input's dtype (HMP)
    FP32 = "fp32"  # FP32 (HMP O2)


class InplaceMode(_Setting):
    """What an in-place or `out=` op does (`inplace:`)."""

    SKIP = "skip"  # never cast (torch.autocast)
    FIRST_INPUT = "first_input"  # cast to the first input's dtype (HMP)


class NativeDevice(_Setting):
    """The torch.autocast device type whose own lists a policy is (`native:`); such a policy can run as
    torch.autocast itself."""

    CPU = "cpu"
    CUDA = "cuda"


__all__ = ["UnlistedMode", "InplaceMode", "NativeDevice"]

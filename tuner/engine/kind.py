"""Which engine runs a policy: the `engine=` argument of `tuner.autocast`, `tuner.attach` and `tuner.load`."""
from __future__ import annotations

from enum import Enum

from tuner.core.errors import ConfigError


class EngineKind(str, Enum):
    """`AUTO` runs torch.autocast itself where it gives the same result, `PYTHON` always mpt's engine,
    `TORCH` torch.autocast or an error. Public functions also take the values as strings."""

    AUTO = "auto"
    PYTHON = "python"
    TORCH = "torch"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: str | EngineKind) -> EngineKind:
        """The member for `value` (a member or its string); ConfigError for anything else."""
        if isinstance(value, EngineKind):
            return value
        try:
            return cls(value)
        except ValueError:
            raise ConfigError(f"engine: expected auto, python or torch, found {value!r}") from None


__all__ = ["EngineKind"]

"""Why an op call got its precision, as data: the `Rule` enum.

The engine records one Rule per call (`Decision.rule`); code decides on its
properties (`forced`, `mutates`) and renderers show its `.text`, so no code
branches on display strings. Values are stable identifiers (they appear in
`mpt inspect --json`); the list rules keep the names the op lists use, so
`Rule.LOWER == "lower"`.
"""
from __future__ import annotations

from enum import Enum

from tuner.policy.modes import UnlistedMode


class Rule(str, Enum):
    """The reason for one op call's precision; `.text` is what `mpt inspect` shows."""

    LOWER = "lower"
    FP32 = "fp32"
    PROMOTE = "promote"
    BANNED = "banned"
    PASSTHROUGH = "passthrough"
    FIRST_INPUT = "first_input"
    UNLISTED_FP32 = "unlisted_fp32"
    INPLACE = "inplace"
    INPLACE_FIRST_INPUT = "inplace_first_input"
    OUT = "out"
    OUT_FIRST_INPUT = "out_first_input"
    EXPLICIT_DTYPE = "explicit_dtype"
    MODULE = "module"
    INSTANCE = "instance"
    FLOAT64 = "float64"
    OTHER_DEVICE = "other_device"
    NO_FLOAT = "no_float"
    MODEL_FP32 = "model_fp32"  # the model's own `torch.autocast(..., enabled=False)` region
    MODEL_AUTOCAST = "model_autocast"  # the model's own `torch.autocast(...)` region: torch.autocast decides

    def __str__(self) -> str:
        return self.value

    @property
    def text(self) -> str:
        """Display text, e.g. `lower list`, `in-place: not autocast`."""
        return _TEXT[self]

    @property
    def forced(self) -> bool:
        """The call's precision is not the policy's to choose (in-place, out=, explicit dtype=, no castable input)."""
        return self in _FORCED

    @property
    def mutates(self) -> bool:
        """The op writes into an existing tensor (in-place or out=): replaying it would change its inputs."""
        return self in _MUTATES

    @property
    def override(self) -> bool:
        """A per-module or per-instance override decided, not the op lists."""
        return self in (Rule.MODULE, Rule.INSTANCE)

    def describe(self, detail: str = "") -> str:
        """The display text with the call's detail: `module override: fp32`, `lower list (as matmul)`."""
        if not detail:
            return self.text
        return f"{self.text}: {detail}" if self.override else f"{self.text} ({detail})"

    @classmethod
    def unlisted(cls, setting: UnlistedMode) -> Rule:
        """The rule for an op no list names, from a policy's `unlisted:` setting."""
        return _UNLISTED[setting]


_TEXT = {
    Rule.LOWER: "lower list",
    Rule.FP32: "fp32 list",
    Rule.PROMOTE: "promote list",
    Rule.BANNED: "banned list",
    Rule.PASSTHROUGH: "unlisted: passthrough",
    Rule.FIRST_INPUT: "unlisted: first input",
    Rule.UNLISTED_FP32: "unlisted: fp32",
    Rule.INPLACE: "in-place: not autocast",
    Rule.INPLACE_FIRST_INPUT: "in-place: cast to 1st input's type",
    Rule.OUT: "out=: not autocast",
    Rule.OUT_FIRST_INPUT: "out=: cast to 1st input's type",
    Rule.EXPLICIT_DTYPE: "explicit dtype= wins",
    Rule.MODULE: "module override",
    Rule.INSTANCE: "instance override",
    Rule.FLOAT64: "float64: never cast",
    Rule.OTHER_DEVICE: "on another device: not cast",
    Rule.NO_FLOAT: "no floating-point input",
    Rule.MODEL_FP32: "kept FP32 by the model (its autocast is off)",
    Rule.MODEL_AUTOCAST: "the model's own torch.autocast decides",
}
_MUTATES = frozenset({Rule.INPLACE, Rule.INPLACE_FIRST_INPUT, Rule.OUT, Rule.OUT_FIRST_INPUT})
_FORCED = _MUTATES | {Rule.EXPLICIT_DTYPE, Rule.FLOAT64, Rule.OTHER_DEVICE, Rule.NO_FLOAT, Rule.MODEL_FP32,
                        Rule.MODEL_AUTOCAST}
_UNLISTED = {UnlistedMode.PASSTHROUGH: Rule.PASSTHROUGH, UnlistedMode.FIRST_INPUT: Rule.FIRST_INPUT,
             UnlistedMode.FP32: Rule.UNLISTED_FP32}

__all__ = ["Rule"]

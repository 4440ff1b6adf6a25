"""What a tune is asked: `TuneOptions`, the search's options (`tuner.tune(...)`, `mpt tune`)."""
from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from tuner.core.dtypes import lower_name
from tuner.options.fields import Kind, Options, option
from tuner.options.shared import (
    DEFAULT_PRESET,
    device_option,
    dtype_option,
    preset_option,
    tolerance_option,
    tolerance_rule,
)

__all__ = ["TuneOptions", "RankMethod", "MIN_MAX_EVALS"]

MIN_MAX_EVALS = 3  # the baseline twice (tuner.search.noise) + one trial


class RankMethod(str, enum.Enum):
    """How op instances are ranked before the search."""

    GRADIENT = "gradient"  # one forward with every op's low-precision error, plus a few backward passes
    EXACT = "exact"  # one forward per op instance


@dataclass(frozen=True)
class TuneOptions(Options):
    """What to search for. Validated on construction (ConfigError naming each option's key).

    `dtype` takes any spelling of a lower dtype (or a torch.dtype) and keeps
    its short name; `preset` None becomes the device's default preset.
    """

    dtype: str = dtype_option("bf16")
    preset: str | None = preset_option()
    tolerance: float = tolerance_option(0.01, "Allowed loss against the FP32 baseline: relative (0.01 = 1%) unless "
                                              "--absolute.")
    absolute: bool = option(False, "Treat --tolerance as an absolute drop of the metric.", Kind.BOOL)
    lower_is_better: bool = option(False, "The metric is a loss/perplexity: lower is better.", Kind.BOOL)
    max_evals: int | None = option(None, "Stop after N full evaluations (the baseline's runs included; at least 3).",
                                   Kind.INT, minimum=MIN_MAX_EVALS, metavar="N")
    time_budget: float | None = option(None, "Seconds from the start of the command; no evaluation is started that "
                                       "would end after it (the best confirmed plan is kept).", Kind.NUMBER,
                                       minimum=0, exclusive_min=True, metavar="SECONDS")
    device: str = device_option()
    thorough: bool = option(False, "Prove every FP32 instance necessary (more evaluations).", Kind.BOOL)
    rank: str = option("gradient", "How to rank op instances before the search: gradient = one forward with every "
                       "op's low-precision error plus a few backward passes (first-order damage to the output); "
                       "exact = one forward per op instance (slower; catches saturation effects).", Kind.CHOICE,
                       choices=tuple(m.value for m in RankMethod))

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", lower_name(self.dtype))
        super().__post_init__()
        if self.preset is None:
            object.__setattr__(self, "preset", DEFAULT_PRESET[self.device])

    def _rules(self, bad: Collection[str]) -> list[tuple[str, str]]:
        return [*super()._rules(bad), *tolerance_rule(vars(self), bad)]

    def target(self, baseline: float) -> float:
        return baseline + self.slack(baseline) if self.lower_is_better else baseline - self.slack(baseline)

    def slack(self, baseline: float) -> float:
        return self.tolerance if self.absolute else self.tolerance * abs(baseline)

    def settings(self) -> dict[str, Any]:
        """What decides trial outcomes: a journal made with other settings cannot be resumed."""
        return {"dtype": self.dtype, "preset": self.preset, "tolerance": self.tolerance, "absolute": self.absolute,
                "lower_is_better": self.lower_is_better, "device": self.device}

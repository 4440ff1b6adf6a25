"""What a tune is asked: `TuneOptions`, the search's options (`tuner.tune(...)`, `mpt tune`)."""
from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from tuner.core.dtypes import LOWER_CHOICES, lower_name
from tuner.options.fields import Kind, Options, option
from tuner.options.shared import (
    DEFAULT_PRESET,
    LOSS_METRICS,
    METRICS,
    batch_size_option,
    data_option,
    device_option,
    dtype_option,
    preset_option,
    tokenizer_option,
    tolerance_option,
    tolerance_rule,
)

__all__ = ["TuneOptions", "RankMethod", "Granularity", "MIN_MAX_EVALS"]

MIN_MAX_EVALS = 2  # the baseline (once: tuner.search.noise) + one trial


class RankMethod(str, enum.Enum):
    """How op instances are ranked before the search."""

    GRADIENT = "gradient"  # one forward with every op's low-precision error, plus a few backward passes
    EXACT = "exact"  # one forward per op instance


class Granularity(str, enum.Enum):
    """What one search decision covers."""

    INSTANCE = "instance"  # one op call site (module, op, call index): the finest plan
    TYPE = "type"  # every call of one op type: a plan op-type lists (HMP, Gaudi autocast) express as it is


@dataclass(frozen=True)
class TuneOptions(Options):
    """What to search for. Validated on construction (ConfigError naming each option's key).

    `dtype` takes any spelling of a lower dtype (or a torch.dtype) and keeps
    its short name; `preset` None becomes the device's default preset.
    """

    dtype: str = dtype_option("bf16")
    preset: str | None = preset_option()
    tolerance: float = tolerance_option(None, "Allowed loss against the FP32 baseline: relative (0.01 = 1%) unless "
                                              "--absolute. Default 0.01; with --metric, the metric's own (absolute: "
                                              "agreement 0.01, cosine 0.001, kl 0.01, rel-error 0.02; relative: "
                                              "loss and perplexity 0.01).")
    absolute: bool = option(False, "Treat --tolerance as an absolute drop of the metric.", Kind.BOOL)
    lower_is_better: bool = option(False, "The metric is a loss/perplexity: lower is better.", Kind.BOOL)
    max_evals: int | None = option(None, "Stop after N full evaluations (the baseline's runs included; at least 2).",
                                   Kind.INT, minimum=MIN_MAX_EVALS, metavar="N")
    time_budget: float | None = option(None, "Seconds from the start of the command; no evaluation is started that "
                                       "would end after it (the best confirmed plan is kept).", Kind.NUMBER,
                                       minimum=0, exclusive_min=True, metavar="SECONDS")
    device: str = device_option()
    thorough: bool = option(False, "Prove every FP32 instance necessary (more evaluations).", Kind.BOOL)
    for_training: bool = option(False, "evaluate trains the model (mixed precision training): every trial keeps "
                                "the parameters and buffers FP32 and lowers only the compute, per op, forward and "
                                "backward, as torch.autocast does; the model and every random generator are reset "
                                "before each trial; no lowered checkpoint is written (the FP32 weights are yours).",
                                Kind.BOOL)
    seeds: int = option(1, "With --for-training: train each trial N times, each run from its own random "
                        "generator states (seed k), and judge the mean metric against the target with the runs' "
                        "spread as the noise margin; the report says which plans pass on some seeds only.",
                        Kind.INT, minimum=1, metavar="N")
    rank: str = option("gradient", "How to rank op instances before the search: gradient = one forward with every "
                       "op's low-precision error plus a few backward passes (first-order damage to the output); "
                       "exact = one forward per op instance (slower; catches saturation effects).", Kind.CHOICE,
                       choices=tuple(m.value for m in RankMethod))
    granularity: str = option("instance", "What the search decides about: instance = each op call site; type = "
                              "each op type, every instance of a type in one dtype (a plan the op-type list files, "
                              "HMP's and Gaudi autocast's, express as it is).", Kind.CHOICE,
                              choices=tuple(g.value for g in Granularity))

    fallback: str | None = option(None, "The first fallback of an op that fails in --dtype: the other 16-bit dtype "
                                  "(--dtype fp16 --fallback bf16: an op whose values leave fp16's range runs in "
                                  "bf16, at the same speed on a GPU, not FP32); FP32 stays the last fallback. "
                                  "Default: none, FP32 at once.", Kind.CHOICE, choices=LOWER_CHOICES,
                                  after="dtype")
    metric: str | None = option(None, "Built-in fidelity metric against the FP32 model's outputs on calibration "
                                "batches (--data, calibration_batches() or a list from example_inputs()), used "
                                "instead of evaluate: agreement (top-1), cosine, kl, rel-error; or a language "
                                "model's own next-token loss or perplexity on the data. Sets --lower-is-better "
                                "(and --absolute for a metric against FP32).", Kind.CHOICE, choices=METRICS)
    output: str | None = option(None, "The output --metric compares: logits, last_hidden_state or a dotted path "
                                "(hidden_states.2); default the output itself if a tensor, else logits, "
                                "sentence_embedding, last_hidden_state, the first tensor.", Kind.STR, metavar="PATH")
    data: str | None = data_option()
    tokenizer: str | None = tokenizer_option()
    batch_size: int = batch_size_option()

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", lower_name(self.dtype))
        if self.fallback is not None:
            object.__setattr__(self, "fallback", lower_name(self.fallback))
        self._metric_defaults()
        super().__post_init__()
        if self.preset is None:
            object.__setattr__(self, "preset", DEFAULT_PRESET[self.device])

    def _metric_defaults(self) -> None:
        """A built-in metric's direction, absolute tolerance and default tolerance: absolute against FP32 (its
        value is exact), relative for the loss metrics (`--absolute` still makes theirs absolute)."""
        if self.metric not in METRICS:
            if self.tolerance is None:
                object.__setattr__(self, "tolerance", 0.01)
            return
        lower = self.metric in ("kl", "rel-error", *LOSS_METRICS)
        if self.lower_is_better and not lower:
            return  # _rules says why
        object.__setattr__(self, "lower_is_better", lower)
        if self.metric not in LOSS_METRICS:
            object.__setattr__(self, "absolute", True)
        if self.tolerance is None:
            object.__setattr__(self, "tolerance", {"agreement": 0.01, "cosine": 0.001, "kl": 0.01,
                                                   "rel-error": 0.02, "loss": 0.01, "perplexity": 0.01}[self.metric])

    def _rules(self, bad: Collection[str]) -> list[tuple[str, str]]:
        problems = [*super()._rules(bad), *tolerance_rule(vars(self), bad)]
        if self.metric in ("agreement", "cosine") and self.lower_is_better:
            problems.append(("lower_is_better", f"lower_is_better: metric {self.metric} is higher-is-better; "
                                                "drop lower_is_better"))
        if self.fallback is not None and self.fallback == self.dtype:
            problems.append(("fallback", f"fallback: {self.fallback} is the tune's own dtype; the fallback is the "
                                         "other 16-bit dtype (--dtype fp16 --fallback bf16)"))
        if self.for_training and self.metric is not None:
            problems.append(("for_training", f"for_training: the built-in metric {self.metric} only runs forwards "
                                             "of the model, so nothing trains; give the evaluate that trains it, "
                                             "or drop `for_training`"))
        if "seeds" not in bad and self.seeds > 1 and not self.for_training:
            problems.append(("seeds", f"seeds: {self.seeds} training runs per trial need `for_training` (an "
                                      "inference evaluate is judged as it is: its noise is measured on the FP32 "
                                      "baseline)"))
        if self.metric is None and (self.output is not None):
            problems.append(("output", "output: names what a built-in --metric compares; give metric too"))
        return problems

    def target(self, baseline: float) -> float:
        return baseline + self.slack(baseline) if self.lower_is_better else baseline - self.slack(baseline)

    def slack(self, baseline: float) -> float:
        return self.tolerance if self.absolute else self.tolerance * abs(baseline)

    def settings(self) -> dict[str, Any]:
        """What decides trial outcomes: a journal made with other settings cannot be resumed."""
        settings = {"dtype": self.dtype, "preset": self.preset, "tolerance": self.tolerance, "absolute": self.absolute,
                    "lower_is_better": self.lower_is_better, "device": self.device}
        if self.fallback is not None:  # absent by default: journals from before fallback chains still resume
            settings["fallback"] = self.fallback
        if self.granularity != Granularity.INSTANCE.value:  # absent by default: older journals still resume
            settings["granularity"] = self.granularity
        if self.for_training:  # absent otherwise: journals from before training mode still resume
            settings["for_training"] = True
        # how the search goes decides which trials run and which plan is chosen: a resumed run cannot mix two
        # (recorded when not the default, so journals from before they were recorded still resume)
        if self.seeds != 1:  # absent by default: journals from before --seeds still resume
            settings["seeds"] = self.seeds
        if self.thorough:
            settings["thorough"] = True
        if RankMethod(self.rank) is not RankMethod.GRADIENT:
            settings["rank"] = RankMethod(self.rank).value
        if self.metric is not None:  # absent otherwise: journals from before built-in metrics still resume
            settings.update(metric=self.metric, output=self.output, data=self.data, tokenizer=self.tokenizer,
                            batch_size=self.batch_size)
        return settings

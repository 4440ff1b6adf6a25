"""Each command's options: one frozen dataclass per command, one field per option.

Adding an option to a command is adding a field here (or to TuneOptions for
a setting of the search): the CLI makes its flag from the field, the config
file takes its key, and the checks come with its kind. `COMMANDS` maps a
command's name to its class; `CONFIGURED` names those a config file serves.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass

from tuner.core.hf_config import default_metric_name, is_hf_spec
from tuner.options.fields import Kind, Options, option
from tuner.options.shared import (
    batch_size_option,
    build_option,
    data_option,
    device_option,
    dtype_option,
    eval_option,
    inputs_option,
    json_option,
    model_option,
    preset_option,
    resume_rule,
    tokenizer_option,
    tolerance_option,
)
from tuner.options.tune import TuneOptions

__all__ = ["TuneCommandOptions", "InspectOptions", "CheckOptions", "PresetsOptions", "COMMANDS", "CONFIGURED",
           "COMMAND_LINE_ONLY"]

MODEL_HELP = ("The model file: build_model(), evaluate(model), example_inputs(); MODEL.py:NAME picks another builder; "
              "hf:DIR a Hugging Face model folder (save_pretrained) with --data.")


@dataclass(frozen=True)
class TuneCommandOptions(TuneOptions):
    """`mpt tune`: the search's options plus the model, the output folder and how the run is shown."""

    model: str | None = model_option(positional=True, help=MODEL_HELP,
                                     required="missing MODEL.py: give it as the argument or as `model:` in --config")
    out: str = option("mpt-out", "Output folder; `mpt check` reads it.", Kind.PATH, metavar="DIR", after="model")
    resume: bool = option(False, "Continue the run in --out; finished evaluations are not repeated.", Kind.BOOL,
                          after="time_budget")
    overwrite: bool = option(False, "Replace a previous run in --out.", Kind.BOOL, after="resume")
    latency: bool = option(True, "Time the tuned model against FP32 on the example inputs after the search "
                           "(report.json latency_ms); --no-latency skips it (latency_ms: null, no slower-than-FP32 "
                           "warning).", Kind.BOOL, negatable=True, after="thorough")
    consolidate: bool = option(False, "A sharded model (FSDP2, tensor parallel) under torchrun: also write the whole "
                               "checkpoint as one model.safetensors beside the sharded model.dcp/, so tuner.load "
                               "loads it into the unsharded model (gathers each full tensor once).", Kind.BOOL,
                               after="latency")
    save_pretrained: str | None = option(None, "An hf: model: also write the tuned model to SAVED as a Hugging "
                                         "Face folder (config, tokenizer files, the weights as model.safetensors "
                                         "stores them, plan.yaml): tuner.load(\"hf:SAVED\") loads it with the "
                                         "plan attached, from_pretrained(SAVED) the weights alone.", Kind.PATH,
                                         metavar="SAVED", after="out")
    quiet: bool = option(False, "Only the final verdict.", Kind.BOOL, short="-q")
    build: str | None = build_option()
    eval: str | None = eval_option()
    inputs: str | None = inputs_option()

    def __post_init__(self) -> None:
        if self.metric is None and is_hf_spec(self.model):  # an hf: model has no evaluate: its head decides
            object.__setattr__(self, "metric", default_metric_name(self.model or ""))
        super().__post_init__()

    def _rules(self, bad: Collection[str]) -> list[tuple[str, str]]:
        problems = [*super()._rules(bad), *resume_rule(vars(self), bad)]
        if self.save_pretrained and self.model and not is_hf_spec(self.model) and "model" not in bad:
            problems.append(("save_pretrained", "save_pretrained: writes a Hugging Face folder, so it takes an "
                                                "hf:DIR model; a model file's tuned model loads with "
                                                "tuner.load(build_model(), OUT)"))
        return problems

    def tune_options(self) -> TuneOptions:
        """The search's options alone (what `tuner.tune` and the journal's fingerprint see)."""
        return TuneOptions(**{f.name: getattr(self, f.name) for f in dataclasses.fields(TuneOptions)})

    def specs(self) -> dict[str, str | None]:
        """The build/eval/inputs functions as the user named them (recorded in the plan)."""
        return {"build": self.build, "eval": self.eval, "inputs": self.inputs}


@dataclass(frozen=True)
class InspectOptions(Options):
    """`mpt inspect`: the model, the policy (a preset, its lists replaced, or a plan) and what to show."""

    model: str | None = model_option(positional=True, help=MODEL_HELP,
                                     required="missing MODEL.py: give it as the argument or as `model:` in --config")
    dtype: str | None = dtype_option(None)
    preset: str | None = preset_option()
    plan: str | None = option(None, "Plan to apply: a plan.yaml or a `mpt tune` output folder.", Kind.PATH,
                              metavar="FILE|DIR", replaces=("preset",))
    module: tuple[str, ...] = option((), "Per-module override, e.g. --module 'encoder.layers.0.*=fp32'. Repeatable.",
                                     Kind.MODULES, metavar="PATH=DTYPE", multiple=True)
    lower_list: str | None = option(None, "Op-list file (one op per line, HMP/Gaudi format, or YAML) replacing the "
                                    "preset's lower-precision list.", Kind.PATH, metavar="FILE")
    fp32_list: str | None = option(None, "Op-list file replacing the preset's FP32 list.", Kind.PATH, metavar="FILE")
    json: bool = json_option()
    top: int | None = option(None, "Show only the N calls that add the most error themselves (local; error where "
                             "local is unknown).", Kind.INT, minimum=1, metavar="N")
    data: str | None = data_option()
    tokenizer: str | None = tokenizer_option()
    batch_size: int = batch_size_option()
    build: str | None = build_option()
    eval: str | None = eval_option()
    inputs: str | None = inputs_option()

    def _rules(self, bad: Collection[str]) -> list[tuple[str, str]]:
        problems = super()._rules(bad)
        if self.preset and self.plan:
            problems.append(("preset", "give `preset` or `plan`, not both"))
        elif self.plan and (self.lower_list or self.fp32_list):
            problems.append(("plan", "`lower_list`/`fp32_list` change a preset's lists; they cannot be combined "
                                     "with `plan`"))
        return problems

    def modules(self) -> dict[str, str]:
        """The per-module overrides, {module path or glob: dtype}."""
        return dict(item.split("=", 1) for item in self.module)


@dataclass(frozen=True)
class CheckOptions(Options):
    """`mpt check`: the plan folder, the model as it is now, and how to report."""

    out: str | None = option(None, "The folder `mpt tune --out` wrote, or its plan.yaml.", Kind.PATH, metavar="DIR",
                             positional=True, required="missing DIR: give the plan folder as the argument or as "
                                                       "`out:` in --config")
    model: str | None = model_option(positional=False, help="The model file, MODEL.py or MODEL.py:NAME (default: "
                                                            "the one the plan records, relative to DIR).")
    tolerance: float | None = tolerance_option(None, "Override the plan's tolerance (default: the one it was tuned "
                                                     "with, in plan.yaml).")
    device: str = device_option()
    checkpoint: bool = option(False, "Evaluate DIR/model.safetensors (the stored weights) instead of the weights "
                              "build_model gives now.", Kind.BOOL)
    json: bool = json_option()
    junit: str | None = option(None, "Also write a JUnit XML report to FILE.", Kind.PATH, metavar="FILE")
    build: str | None = build_option()
    eval: str | None = eval_option()
    inputs: str | None = inputs_option()

    def specs(self) -> dict[str, str | None]:
        """The build/eval/inputs functions the caller named (None: the plan's)."""
        return {"build": self.build, "eval": self.eval, "inputs": self.inputs}


@dataclass(frozen=True)
class PresetsOptions(Options):
    """`mpt presets`: one preset to show, or all of them."""

    name: str | None = option(None, "A preset to show in full (its source, rules and lists); without it, one line "
                              "per preset.", Kind.STR, metavar="[NAME]", positional=True)
    lists_only: str | None = option(None, "Print just that list, one op per line (the HMP/Gaudi list-file format).",
                                    Kind.CHOICE, choices=("lower", "fp32", "promote"))


COMMANDS: dict[str, type[Options]] = {"tune": TuneCommandOptions, "inspect": InspectOptions, "check": CheckOptions,
                                      "presets": PresetsOptions}
CONFIGURED = ("tune", "inspect", "check")  # the commands that take --config
# Keys a command takes from its command line only, not from a config file: a config's `tolerance` is what
# `mpt tune` searches for; `mpt check --config` judges by the tolerance the plan records (the target it was
# tuned and committed for), so a loose config value cannot make a broken plan pass. `--tolerance` overrides it.
COMMAND_LINE_ONLY: dict[str, frozenset[str]] = {"check": frozenset({"tolerance"})}



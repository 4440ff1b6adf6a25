"""`tuner.inspect`: what precision each op call of a model file runs in, why, and how much error it adds.

What `mpt inspect` calls: it takes the command's options (InspectOptions),
builds the user's model in eval mode, picks the policy (a plan, or a preset
with its op lists replaced), runs `tuner.measure.inspection.inspect_model`
and keeps the records to show (`top`). The CLI only renders the result.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.core.errors import ConfigError
from tuner.core.hf_config import is_hf_spec
from tuner.core.loader import load_user_model
from tuner.jobs.prepare import load_model
from tuner.measure.inspection import InspectResult, InspectSummary, OpRecord, inspect_model, top_records
from tuner.options.commands import InspectOptions
from tuner.policy.plan import Plan
from tuner.policy.presets import Policy, custom_policy, load_preset, read_op_list

__all__ = ["InspectRun", "inspect"]


@dataclass(frozen=True)
class InspectRun:
    """An inspection of a model file: every record, those to show (`top` applied), and the file's name."""

    result: InspectResult
    shown: list[OpRecord]
    model_name: str
    top: int | None = None

    @property
    def summary(self) -> InspectSummary:
        return self.result.summary

    def to_dict(self) -> dict[str, Any]:
        """The JSON document `mpt inspect --json` prints: the shown records and the summary."""
        data = self.result.to_dict()
        position = {id(r): n for n, r in enumerate(self.result.records)}
        data["records"] = [data["records"][position[id(r)]] for r in self.shown]
        return data


def _op_lists(options: InspectOptions) -> dict[str, list[str] | None]:
    """The op lists that replace the preset's, read from `lower_list`/`fp32_list`; every problem at once."""
    problems: list[str] = []
    lists: dict[str, list[str] | None] = {"lower": None, "fp32": None}
    for key, path in (("lower", options.lower_list), ("fp32", options.fp32_list)):
        if path:
            try:
                lists[key] = read_op_list(path)
            except ConfigError as exc:
                name = path.replace("\\", "/").rsplit("/", 1)[-1]
                problems += [e if e.startswith(f"{name}:") or path in e else f"{path}: {e}" for e in exc.errors]
    if lists["lower"] is not None and lists["fp32"] is not None:
        both = sorted(set(lists["lower"]) & set(lists["fp32"]))
        if both:
            problems.append(f"op(s) in both `lower_list` {options.lower_list} and `fp32_list` {options.fp32_list}: "
                            f"{', '.join(both)}; an op runs in one precision")
    if problems:
        raise ConfigError(problems)
    return lists


def _policy(options: InspectOptions) -> Policy | Plan | str:
    """The plan file, the preset (torch-cpu by default), or the preset with its lists replaced."""
    if options.plan:
        return options.plan
    preset = options.preset or "torch-cpu"
    if not (options.lower_list or options.fp32_list):
        return preset
    lists = _op_lists(options)
    return custom_policy(load_preset(preset), lower=lists["lower"], fp32=lists["fp32"])


def inspect(options: InspectOptions) -> InspectRun:  # public as tuner.inspect; shadows no module
    """Run the model file's example_inputs() in FP32 and under the policy, and explain every op call.

    The model is built in eval mode, as `mpt tune` and `mpt check` run it (no
    dropout; BatchNorm's running statistics). Raises ConfigError (bad op
    lists, no example_inputs), PlanMismatchError or UserCodeError.
    """
    assert options.model is not None  # InspectOptions refuses a missing model
    if options.plan and not Path(options.plan).exists():  # before the model is built; else it reads as a preset
        raise ConfigError(f"plan: {options.plan} not found; give a plan.yaml or the folder `mpt tune --out` wrote",
                          fields=("plan",))
    if options.data is not None or is_hf_spec(options.model):  # the first batch of --data is the example
        user = load_model(options.model, specs={"build": options.build, "inputs": options.inputs},
                          fidelity={"data": options.data, "tokenizer": options.tokenizer,
                                    "batch_size": options.batch_size})
    else:
        user = load_user_model(options.model, model=options.build, eval=options.eval, inputs=options.inputs,
                               require_eval=False)
    inputs = user.example_inputs()
    if inputs is None:
        raise ConfigError(f"{user.path.name} defines no example_inputs(); add one or pass `inputs` NAME")
    model = user.build().eval()
    result = inspect_model(model, inputs, _policy(options), options.dtype, modules=options.modules() or None)
    shown = top_records(result.records, options.top) if options.top else result.records
    return InspectRun(result, shown, user.path.name, options.top)

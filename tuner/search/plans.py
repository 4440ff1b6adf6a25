"""The plans a tune tries and writes, and the pruning of FP32 overrides that change nothing."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from tuner.core.inputs import ModelInputs
from tuner.core.loader import call_forward
from tuner.engine.attach import autocast
from tuner.engine.function_mode import Decision
from tuner.engine.kind import EngineKind
from tuner.options.tune import TuneOptions
from tuner.policy.plan import OpInstance, Plan
from tuner.policy.presets import Policy
from tuner.policy.rules import Rule
from tuner.search.decisions import inputs_all_fp32

# Rules under which an op runs in its inputs' precision: with FP32 inputs an FP32 override changes nothing.
_FROM_INPUTS = frozenset({Rule.PASSTHROUGH, Rule.FIRST_INPUT, Rule.PROMOTE})


def plan_for(options: TuneOptions, fp32_modules: Mapping[str, str], fp32: Iterable[OpInstance],
             **extra: Any) -> Plan:
    """The plan that runs the preset in the options' dtype with `fp32_modules` and the `fp32` instances in FP32."""
    return Plan(dtype=options.dtype, preset=options.preset,  # type: ignore[arg-type]
                modules=tuple(sorted((p, "fp32") for p in fp32_modules)),
                fp32_instances=tuple(sorted(fp32)), **extra)


def no_op_overrides(model: nn.Module, inputs: ModelInputs, plan: Plan, policy: Policy) -> set[OpInstance]:
    """The plan's FP32 overrides that change nothing: ops that run in their inputs' precision and, with their
    producers in FP32, get only FP32 inputs. One recorded forward, no evaluation."""
    wanted = set(plan.fp32_instances)
    idle: set[OpInstance] = set()

    def record(d: Decision, *rest: Any) -> None:
        inst = OpInstance(d.module, d.op, d.index)
        if inst in wanted and policy.lookup(d.op)[0] in _FROM_INPUTS and inputs_all_fp32(d):
            idle.add(inst)

    with torch.no_grad(), autocast(plan, model=model, recorder=record, engine=EngineKind.PYTHON):
        call_forward(model, inputs)
    return idle

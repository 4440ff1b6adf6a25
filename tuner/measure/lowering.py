"""Which parameters a plan stores lowered, predicted without running the model again.

Every trial holds lowered the parameters its checkpoint would store lowered (`deployed.stored_as`): those
every use of which is a cast to the lower dtype under that plan (`deployed.observe`). Running a forward per
trial to find them costs a forward on the example inputs per evaluation. On the native path the answer
follows from one observation of the plan without its FP32 op instances: torch.autocast casts a parameter to
the lower dtype for a lower-list op whatever the op's other inputs are, and never in an FP32 region. So a
parameter is lowered under a plan exactly when all its uses in that observation were casts and each was
made by a module whose region the plan leaves low (`tuner.engine.native`: FP32 islands and subtrees).

The prediction stands only where a module's region is its own: a module run by a module that is not its
ancestor (a shared module called from elsewhere) runs in its caller's region, so an observation that saw
one, a plan not on the native path, or one with other module overrides than the observed plan gets None
and the caller observes instead. The session checks the
prediction against a real observation of the final plan before it reports it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from tuner.core.inputs import ModelInputs
from tuner.engine import native
from tuner.engine.attach import native_device, resolve
from tuner.measure.deployed import Observation, observe
from tuner.policy.plan import OpInstance, Plan


@dataclass(frozen=True)
class ParameterUses:
    """Each parameter's uses in the deployed forward of a plan with no FP32 op instances but `kept`: (module path,
    cast?); `modules` are that plan's module overrides (modules torch.autocast cannot run low, kept FP32 in
    every trial) and `kept` the op calls every trial keeps FP32 (their modules FP32 islands: the model's own
    forward where torch.autocast cannot run a call of it), which a plan must share for the prediction to hold."""

    uses: dict[str, frozenset[tuple[str, bool]]]
    modules: tuple[tuple[str, str], ...]
    kept: frozenset[OpInstance] = frozenset()


def parameter_uses(model: nn.Module, plan: Plan, inputs: ModelInputs,
                   kept: frozenset[OpInstance] = frozenset()) -> ParameterUses | None:
    """One observation of `plan` without its FP32 op instances but those in `kept` (calls every plan keeps FP32:
    without them the forward may not run at all); None when its regions would not predict (see above)."""
    bare = dataclasses.replace(plan, fp32_instances=tuple(i for i in plan.fp32_instances if i in kept))
    if not predictable(model, bare):
        return None
    return uses_of(observe(model, bare, inputs), bare)


def predictable(model: nn.Module, plan: Plan) -> bool:
    """Whether an observation of `plan` can predict other plans' lowered parameters (the native path)."""
    return _execution(model, plan) is not None


def uses_of(seen: Observation, plan: Plan) -> ParameterUses | None:
    """The ParameterUses of an observation of `plan` (no FP32 op instances but those every plan keeps); None
    when a shared module ran in another module's region."""
    return None if seen.foreign else ParameterUses(seen.uses, tuple(plan.modules), frozenset(plan.fp32_instances))


def predicted_lowered(model: nn.Module, uses: ParameterUses, plan: Plan) -> dict[str, torch.dtype] | None:
    """The parameters `plan` stores lowered, from `uses`; None when the plan is not on the native path or
    overrides other modules than the observed one or lacks one of its kept calls."""
    if tuple(plan.modules) != uses.modules or not uses.kept <= set(plan.fp32_instances):
        return None
    execution = _execution(model, plan)
    if execution is None or execution.dtype is None:
        return None
    islands, subtrees = set(execution.fp32_islands), set(execution.fp32_subtrees)

    def low(path: str) -> bool:
        return path not in islands and not any(path == s or s == "" or path.startswith(s + ".") for s in subtrees)

    return {name: execution.dtype for name, found in uses.uses.items()
            if found and all(cast and low(path) for path, cast in found)}


def _execution(model: nn.Module, plan: Plan) -> native.Execution | None:
    pol, lower, mods, instances = resolve(plan)
    device = native_device(pol)
    if device is None:
        return None
    realized = native.realize(model, device.value, lower, mods, instances)
    return realized if isinstance(realized, native.Execution) else None

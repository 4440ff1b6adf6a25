"""The chosen plan as the op-type lists other tools take as they are: HMP's `bf16_file_path`/`fp32_file_path`
files and Gaudi autocast's `PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST`/`PT_HPU_AUTOCAST_FP32_OPS_LIST` files.

Both tools read one op name per line and nothing else (HMP: `file.read().splitlines()`; the Gaudi bridge:
every `getline` is an op name), so the files hold no comment, and a list given replaces the tool's default
one: each file is the whole list, the preset's lists with the plan's changes. An op type goes to the FP32
list when the plan keeps any instance of it in FP32. Where the plan keeps one instance of a type FP32 and
runs another low, the lists cannot say so: they keep the type FP32 everywhere, and `TypeLevel` says which
types that cost and how much of the plan's lower-precision share (measured by one recorded forward of the
lists' plan, `type_level`). `mpt tune --granularity type` tunes a plan the lists express as it is.

Both tools take one lower dtype per run: a plan with a fallback chain (`Plan.fallback`: op instances in the
other 16-bit dtype) is beyond them, so the lists keep those op types FP32 and say so (`TypeLevel.fallback`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from tuner.core.errors import exc_line
from tuner.core.inputs import ModelInputs
from tuner.measure.recorded import PlanRecord, record_plan
from tuner.measure.shares import Shares
from tuner.policy.opnames import tool_op_name
from tuner.policy.plan import Plan


@dataclass(frozen=True)
class TypeLevel:
    """The chosen plan as op-type lists: `plan` (the preset with its lists replaced, the plan's module
    overrides kept: lists cannot carry those either), its `lower`/`fp32` lists in mpt's op names, the `mixed`
    op types the instance plan keeps FP32 in one place and runs low in another, and the lower-precision shares
    of the instance plan and of the lists' plan (equal when nothing is mixed). The shares are None when there
    were no inputs to measure them on."""

    plan: Plan
    lower: frozenset[str]
    fp32: frozenset[str]
    mixed: tuple[str, ...] = ()
    plan_shares: Shares | None = None
    list_shares: Shares | None = None
    raised: str = ""  # what the lists' plan made the model's own code raise on the example inputs (no share then)
    fallback: tuple[str, ...] = ()  # op types the plan runs in its fallback dtype: the lists keep them FP32

    @property
    def exact(self) -> bool:
        """The lists express the instance plan as it is."""
        return not self.mixed and not self.fallback

    def fallback_text(self) -> str:
        """What the lists cannot say of a fallback chain, plainly, and the share it costs; "" without one."""
        if not self.fallback:
            return ""
        plan = self.plan
        types = ", ".join(f"`{t}`" for t in self.fallback)
        text = (f"> HMP and Gaudi autocast take one lower dtype per run, so the op-type lists cannot run {types} in "
                f"{plan.fallback} beside {plan.dtype} as this plan does (its fallback chain): they keep "
                f"{'it' if len(self.fallback) == 1 else 'them'} FP32")
        if self.plan_shares is not None and self.list_shares is not None:
            own, listed = self.plan_shares.flop_share, self.list_shares.flop_share
            text += (f": {listed:.1%} of matmul/conv FLOPs in 16-bit against the plan's {own:.1%} "
                     f"({(own - listed) * 100:.1f} points lost)")
        return text + ". `tuner.load` and `tuner.autocast` run the plan as it is."

    def names(self, tool: str) -> tuple[list[str], list[str]]:
        """(lower list, FP32 list) as `tool` ("hmp" or "gaudi") names the ops, sorted."""
        return (sorted({tool_op_name(n, tool) for n in self.lower}),
                sorted({tool_op_name(n, tool) for n in self.fp32}))


def list_text(names: list[str]) -> str:
    """A list file's text: one name per line, nothing else (what HMP and the Gaudi bridge read)."""
    return "".join(f"{n}\n" for n in names)


def lists_plan(plan: Plan, types: frozenset[str]) -> Plan:
    """`plan` with its instance overrides replaced by whole-list changes: each op type in `types` moved to the
    FP32 list (and the lower-list name it matched, through an alias or itself, out of the lower list)."""
    listed = plan.with_types_fp32(types)
    return Plan(dtype=plan.dtype, preset=plan.preset, lower=listed.lower, fp32=listed.fp32, modules=plan.modules,
                model=plan.model, for_training=plan.for_training)  # no fallback: one lower dtype per run


def _fp32(model: nn.Module | Callable[[], nn.Module]) -> nn.Module:
    """The model with its FP32 weights: `model`, or what the function `model` gives."""
    return model if isinstance(model, nn.Module) else model()


def type_level(plan: Plan, model: nn.Module | Callable[[], nn.Module] | None = None,
               inputs: ModelInputs | None = None, *, recorded: PlanRecord | None = None) -> TypeLevel:
    """The plan as op-type lists; with `model` and `inputs`, which types the lists cost and how much share,
    from one recorded forward of each plan (no grad; the model is left as it was). `recorded`: the plan's own
    recorded forward when the tune already ran it (`TuneResult.recorded`): then only the lists' plan is
    recorded, and only when it differs (some type is mixed), so the report runs no forward the search ran.
    `model` may be a function giving the model with its FP32 weights, called only for such a forward."""
    other = tuple(sorted({i.op for i in plan.fallback_instances}))  # one lower dtype per run: FP32 in the lists
    types = frozenset(i.op for i in plan.fp32_instances) | set(other)
    listed = lists_plan(plan, types)
    policy = listed.policy()
    if model is None or inputs is None or not (inputs.args or inputs.kwargs):
        return TypeLevel(listed, policy.lower, policy.fp32, fallback=other)
    own = record_plan(_fp32(model), plan, inputs) if recorded is None else recorded
    mixed = tuple(sorted(frozenset(i.op for i in plan.fp32_instances) & own.low_ops))
    if not mixed and not other:
        return TypeLevel(listed, policy.lower, policy.fp32, mixed, own.shares, own.shares)
    try:
        shares = record_plan(_fp32(model), listed, inputs).shares
    except Exception as exc:  # noqa: BLE001  (a plan the lists make can break the model's own code: a finding)
        return TypeLevel(listed, policy.lower, policy.fp32, mixed, own.shares, None, exc_line(exc, 200), other)
    return TypeLevel(listed, policy.lower, policy.fp32, mixed, own.shares, shares, fallback=other)

"""lower_precision_ops.txt and fp32_ops.txt: the chosen plan as op-type lists (the format HMP and Gaudi read)."""
from __future__ import annotations

from dataclasses import dataclass

from tuner.core.output_files import PLAN_NAME
from tuner.policy.rules import Rule
from tuner.search.results import TuneResult


@dataclass(frozen=True)
class OpList:
    """One op-type list file: its op names and the comment header above them."""

    ops: frozenset[str]
    header: str


def op_lists(result: TuneResult) -> tuple[OpList, OpList]:
    """(lower-precision list, FP32 list) of `result`'s plan, each with its header."""
    lower, fp32 = op_type_lists(result)
    plan = result.plan
    n_inst = len(plan.fp32_instances)
    note = (f"{n_inst} op instance(s) fall back to FP32 individually; {PLAN_NAME} has them "
            "(op-type lists cannot express single instances)") if n_inst else ""
    return (OpList(frozenset(lower), f"mpt tune: ops that run in {plan.dtype} (preset {plan.preset})\n{note}".strip()),
            OpList(frozenset(fp32), f"mpt tune: ops that run in FP32 (preset {plan.preset})"))


def op_type_lists(result: TuneResult) -> tuple[set[str], set[str]]:
    """Op types for HMP/Gaudi-style lists: a type goes to FP32 only when all its instances fell back."""
    policy = result.plan.policy()
    fp32_inst = {i.key() for i in result.plan.fp32_instances}
    by_type: dict[str, list[bool]] = {}
    for c in result.candidates:
        by_type.setdefault(c.op, []).append(c.key() in fp32_inst)
    all_back = {op for op, flags in by_type.items() if flags and all(flags)}
    lower = (set(policy.lower) - all_back) | {op for op, flags in by_type.items()
                                               if not all(flags) and policy.rule_for(op)[0] is Rule.LOWER}
    fp32 = set(policy.fp32) | (all_back & (set(policy.lower) | set(by_type)))
    return lower - fp32, fp32

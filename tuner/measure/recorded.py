"""One recorded forward of a plan under mpt's engine, and what it tells about the plan.

The report needs a plan's call/FLOP shares and the dtypes it claims each module's ops compute in; the tune
needs to know which of the plan's FP32 overrides change nothing (an op that runs in its inputs' precision
and gets only FP32 inputs runs in FP32 anyway). Both come from the same recording of the same forward, so a
tune records its written plan once (`TuneResult.recorded`) and the report reuses it (issue 20: at 1.1B
parameters a recorded forward costs seconds).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from tuner.core.inputs import ModelInputs
from tuner.engine.function_mode import Decision, PrecisionEngine
from tuner.measure.flops import MATMUL_OPS, RNN_OPS
from tuner.measure.shares import ShareCounter, Shares
from tuner.policy.plan import OpInstance, Plan
from tuner.policy.presets import Policy
from tuner.policy.rules import Rule

# Rules under which an op runs in its inputs' precision: with FP32 inputs an FP32 override changes nothing.
FROM_INPUTS = frozenset({Rule.PASSTHROUGH, Rule.FIRST_INPUT, Rule.PROMOTE})


@dataclass(frozen=True)
class PlanRecord:
    """What a recorded forward of a plan tells: its shares; per module, the dtypes its matmul/conv ops computed in
    (`claimed`) and those of its other ops (`tolerated`); the plan's FP32 (and fallback) overrides that change
    nothing (`idle`: their inputs come in the dtype they name; dropping them leaves every op's dtype, so every
    number above, as it is); the op types that computed in the lower precision somewhere (`low_ops`: what op-type
    lists must keep low)."""

    shares: Shares
    claimed: Mapping[str, frozenset[torch.dtype]] = field(default_factory=dict)
    tolerated: Mapping[str, frozenset[torch.dtype]] = field(default_factory=dict)
    idle: frozenset[OpInstance] = frozenset()
    low_ops: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not isinstance(self.shares, Shares):
            raise TypeError(f"PlanRecord.shares must be Shares, not {type(self.shares).__name__}")


def inputs_all_fp32(decision: Decision, dtype: torch.dtype = torch.float32) -> bool:
    """The call had floating-point inputs, and every one of them was FP32 (or `dtype`)."""
    return bool(decision.in_dtypes) and all(t is dtype for t in decision.in_dtypes)


class PlanRecorder:
    """The recorder (`PrecisionEngine(recorder=...)`) that makes a plan's `PlanRecord`, for a caller that runs
    the forward itself: the candidates' all-low forward (`tuner.search.candidates`) is the recorded forward of
    the all-low plan, so a tune that writes that plan runs no other (GPT-2 774M: a forward of 3 GB less).
    `policy` and `wanted` (its FP32 and fallback instances, by key) are the plan's, as the engine runs it."""

    def __init__(self, policy: Policy, wanted: Mapping[tuple[str, str, int], torch.dtype]) -> None:
        self.policy, self.wanted = policy, wanted
        self.counter = ShareCounter()
        self.claimed: dict[str, set[torch.dtype]] = {}
        self.tolerated: dict[str, set[torch.dtype]] = {}
        self.idle: set[OpInstance] = set()
        self.low_ops: set[str] = set()

    def __call__(self, d: Decision, func: Any, args: tuple, kwargs: dict, out: Any, *raw: Any) -> None:
        self.counter.add(d, args, kwargs, out)
        if d.ran is not None:  # a matmul's claim is what its kernel computed in (`Decision.kernel`)
            gemm = d.op in MATMUL_OPS or d.op in RNN_OPS
            (self.claimed if gemm else self.tolerated).setdefault(d.module, set()).add(d.ran)
        if d.lowered:
            self.low_ops.add(d.op)
        key = (d.module, d.op, d.index)
        if (key in self.wanted and self.policy.lookup(d.op)[0] in FROM_INPUTS
                and inputs_all_fp32(d, self.wanted[key])):
            self.idle.add(OpInstance(*key))

    def record(self) -> PlanRecord:
        """What the forward it watched tells."""
        return PlanRecord(self.counter.shares, {k: frozenset(v) for k, v in self.claimed.items()},
                          {k: frozenset(v) for k, v in self.tolerated.items()}, frozenset(self.idle),
                          frozenset(self.low_ops))


def record_plan(model: nn.Module, plan: Plan, inputs: ModelInputs | tuple) -> PlanRecord:
    """One forward of `inputs` under `plan` (no grad), every op decision recorded."""
    policy = plan.policy()
    recorder = PlanRecorder(policy, plan.instance_overrides())  # FP32 and fallback instances, by key
    with torch.no_grad(), PrecisionEngine(policy, plan.torch_dtype, root=model, recorder=recorder,
                                          module_overrides=plan.module_overrides(),
                                          instance_overrides=plan.instance_overrides(), as_deployed=True):
        ModelInputs.of(inputs).call(model)
    return recorder.record()

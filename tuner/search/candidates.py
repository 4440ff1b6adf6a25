"""The op instances a tune decides about, found by one recorded forward under the preset.

Not candidates: calls the policy cannot choose for (in-place, explicit dtype=), calls that run in FP32 anyway,
numerically neutral ops (views, copies, eval-mode dropout: `opnames.is_neutral`), calls inside modules that
torch.autocast cannot run on this machine (those stay FP32: `fp32_modules`, from `engine.probe.autocast_fixes`), and
the own calls of a module that runs as an FP32 island in every plan (`fp32_calls`: the model's own forward when
torch.autocast cannot run a call of it).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tuner.core.inputs import ModelInputs, detached_copy
from tuner.core.loader import call_forward
from tuner.engine.function_mode import Decision, PrecisionEngine
from tuner.measure.flops import first_tensor, op_flops
from tuner.measure.inspection import relative_error
from tuner.measure.recorded import PlanRecord, PlanRecorder
from tuner.measure.shares import Shares
from tuner.policy.opnames import is_communication, is_neutral
from tuner.policy.plan import OpInstance
from tuner.policy.presets import Policy
from tuner.search.decisions import runs_low


@dataclass(frozen=True, eq=False)  # eq=False: it holds tensors, which do not compare to a bool
class Candidates:
    """The candidates in the order the forward first called them, and what the search needs to know of them.

    `costs` weighs keeping one in FP32 (its matmul/conv FLOPs plus its output size); `flops` are its
    matmul/conv FLOPs alone (`tuner.measure.flops`); `all_low` the shares of the forward with every
    candidate lowered; `ref_out` the FP32 output on `inputs` (a copy: `detached_copy`, so a forward that
    returns, and later rewrites, the dict it was given cannot change it); `all_low_error` the relative error
    of the all-low output against it.
    """

    instances: tuple[OpInstance, ...]
    costs: Mapping[OpInstance, float]
    flops: Mapping[OpInstance, int]
    all_low: Shares
    ref_out: Any
    fp32_modules: Mapping[str, str]  # module path -> why torch.autocast cannot run it here
    inputs: ModelInputs
    all_low_error: float = 0.0
    fp32_calls: tuple[OpInstance, ...] = ()  # FP32 in every plan: their modules run as FP32 islands (`find_candidates`)
    all_low_record: PlanRecord | None = None  # the all-low plan's recorded forward: the one that found them

    def __post_init__(self) -> None:
        if set(self.costs) != set(self.instances) or set(self.flops) != set(self.instances):
            raise ValueError("every candidate needs a cost and a FLOP count, and only candidates have them")
        if len(set(self.instances)) != len(self.instances):
            raise ValueError("a candidate is listed twice")

    def __len__(self) -> int:
        return len(self.instances)

    def units(self) -> list[tuple[int, ...]]:
        """Candidate indices grouped by the module that calls them, in the order modules first call one.

        The search decides per unit: what a loaded plan can run in FP32 without Python per op
        (`tuner.engine.native`)."""
        groups: dict[str, list[int]] = {}
        for i, cand in enumerate(self.instances):
            groups.setdefault(cand.module, []).append(i)
        return [tuple(g) for g in groups.values()]

    def type_units(self) -> list[tuple[int, ...]]:
        """Candidate indices grouped by op type, in the order types are first called (`--granularity type`):
        a unit kept FP32 is a type in the FP32 list."""
        groups: dict[str, list[int]] = {}
        for i, cand in enumerate(self.instances):
            groups.setdefault(cand.op, []).append(i)
        return [tuple(g) for g in groups.values()]

    def pick(self, indices: frozenset[int]) -> frozenset[OpInstance]:
        return frozenset(self.instances[i] for i in indices)

    def by_label(self, labels: tuple[str, ...]) -> tuple[OpInstance, ...]:
        """The candidates with these labels (`OpInstance.label`), sorted."""
        named = {c.label(): c for c in self.instances}
        return tuple(sorted(named[label] for label in labels))

    def flop_shares(self) -> dict[str, float]:
        """Each candidate's matmul/conv FLOPs as a share of the forward's, by label (what search.html lists)."""
        total = self.all_low.flops
        return {c.label(): (self.flops[c] / total if total else 0.0) for c in self.instances}

    def shares_without(self, fp32: frozenset[OpInstance]) -> Shares:
        """The all-low shares with the candidates in `fp32` moved to FP32 (a trial's shares)."""
        return self.all_low.without(len(fp32), sum(self.flops[c] for c in fp32))


FORWARD = object()  # `find_candidates(ref_out=)`: no FP32 output known; one forward gives it


def find_candidates(model: nn.Module, inputs: ModelInputs, policy: Policy, dtype: torch.dtype,
                    fp32_modules: Mapping[str, str], fp32_calls: tuple[OpInstance, ...] = (), *,
                    ref_out: Any = FORWARD) -> Candidates:
    """The op instances whose precision changes the numbers: one FP32 forward for the reference, one recorded
    forward under `policy` with `fp32_modules` and the `fp32_calls` kept FP32. `ref_out`: the FP32 model's
    output on `inputs` where one was already computed (a built-in metric's reference pass on the same batch,
    `FidelityEvaluate.first_output`), a copy no later forward can rewrite; no FP32 forward is run then.

    A module owning one of `fp32_calls` is an FP32 island in every plan (`tuner.engine.native`): all its own
    ops run FP32 once loaded, whatever the plan lists. So its own candidates are no choice: they join
    `fp32_calls` (every plan lists them, and mpt's engine then runs the island's ops as `tuner.load` does) and
    the forward is recorded again with them FP32, for the all-low shares and error."""
    if ref_out is FORWARD:
        with torch.no_grad():
            ref_out = detached_copy(call_forward(model, inputs))  # the next forward may rewrite what it returned
    islands = {c.module for c in fp32_calls}
    recorded = _recorded(model, inputs, policy, dtype, fp32_modules, fp32_calls)
    owned = tuple(c for c in recorded[0] if c.module in islands)
    if owned:
        fp32_calls = tuple(sorted(set(fp32_calls) | set(owned)))
        recorded = _recorded(model, inputs, policy, dtype, fp32_modules, fp32_calls)
    costs, flops, record, low_out = recorded
    return Candidates(instances=tuple(costs), costs=costs, flops=flops, all_low=record.shares, ref_out=ref_out,
                      fp32_modules=dict(fp32_modules), inputs=inputs,
                      all_low_error=relative_error(low_out, ref_out) or 0.0, fp32_calls=tuple(sorted(fp32_calls)),
                      all_low_record=record)


def _recorded(model: nn.Module, inputs: ModelInputs, policy: Policy, dtype: torch.dtype,
              fp32_modules: Mapping[str, str], fp32_calls: tuple[OpInstance, ...]
              ) -> tuple[dict[OpInstance, float], dict[OpInstance, int], PlanRecord, Any]:
    """One forward under `policy` with `fp32_modules` and `fp32_calls` FP32 (the all-low plan, as mpt's engine
    runs it): the candidates' costs and FLOPs (in call order), the forward's record (its shares: the all-low
    plan's `PlanRecord`), and its output."""
    plan = PlanRecorder(policy, {c.key(): torch.float32 for c in fp32_calls})
    costs: dict[OpInstance, float] = {}
    flops: dict[OpInstance, int] = {}

    def record(d: Decision, func: Any, args: tuple, kwargs: dict, out: Any, *raw: Any) -> None:
        plan(d, func, args, kwargs, out, *raw)
        # a neutral op that casts (a lower-list op rounding an FP32 input) does change the numbers
        if (runs_low(d) and not d.forced and not is_communication(d.op)
                and (d.casts > 0 or not is_neutral(d.op, args, kwargs))):
            y = first_tensor(out)
            cand = OpInstance(d.module, d.op, d.index)
            # FP32 takes away only FLOPs that ran low: a kernel that widens them (`Decision.kernel`) ran them FP32
            flops[cand] = op_flops(d.op, args, kwargs, out) if d.ran_low else 0
            costs[cand] = float(flops[cand] + (y.numel() if y is not None else 0))

    with torch.no_grad(), PrecisionEngine(policy, dtype, root=model, recorder=record,
                                          module_overrides={p: torch.float32 for p in fp32_modules},
                                          instance_overrides={c.key(): torch.float32 for c in fp32_calls},
                                          as_deployed=True):
        low_out = call_forward(model, inputs)
    return costs, flops, plan.record(), low_out

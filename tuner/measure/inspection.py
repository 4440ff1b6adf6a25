"""`mpt inspect`: run the inputs once in FP32 and once under a policy, and explain every op call.

Each record says where the call was made (module path), what ran (op, input
dtypes, the dtype it computed in, output dtype), why (the rule), and what it
cost in accuracy: `error` is the relative error of its output against the
FP32 run's output at the same call (everything upstream included), and
`local_error` the error the op itself adds: it re-runs the op on the FP32
run's inputs with the same precision decision. The FP32 values are copied as
each op makes them, since a later in-place op (`relu_`, `+=`) would change
them; an in-place op is replayed on its input as it was before it wrote it.
`neutral` marks calls whose precision cannot change their result (views,
reshapes, copies, dropout in eval: `tuner.policy.opnames.is_neutral`); `top_records`
ranks by the error a call adds itself and leaves those out.
"""
from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from tuner.core.dtypes import short_name
from tuner.core.inputs import ModelInputs, detached_copy, float_leaves, map_tensors
from tuner.core.loader import call_forward
from tuner.engine.attach import PolicyLike, as_plan, autocast, suspended
from tuner.engine.function_mode import Decision
from tuner.engine.kind import EngineKind
from tuner.measure.deployed import stored_as
from tuner.measure.flops import first_tensor, op_flops
from tuner.measure.kernel_hints import kernel_note
from tuner.measure.shares import ShareCounter
from tuner.policy.opnames import is_neutral
from tuner.policy.rules import Rule

_REPLAYABLE = frozenset({torch.bfloat16, torch.float16, torch.float32})  # dtypes `local_error` replays an op in
Key = tuple[str, str, int]  # an op call: module path, op name, call index


@dataclass(frozen=True)
class OpRecord:
    module: str
    op: str
    index: int
    input_dtypes: tuple[str, ...]
    dtype: str
    output_dtype: str
    rule: Rule
    reason: str
    casts: int
    flops: int
    error: float | None
    local_error: float | None
    nonfinite: bool
    neutral: bool = False  # its precision cannot change its result (a view, reshape, copy, eval dropout)
    # when its kernel computed in another dtype than it was cast to (`dtype` is the kernel's then): what it ran,
    # and the cheap change that lets it run in the cast dtype, if one does (`tuner.measure.kernel_hints`)
    kernel_note: str = ""

    @property
    def label(self) -> str:
        return f"{self.module or '(root)'}:{self.op}#{self.index}"

    @property
    def adds_error(self) -> bool:
        """Whether the call can add error of its own: not a neutral op, unless it cast an input itself."""
        return not self.neutral or self.casts > 0


@dataclass(frozen=True)
class InspectSummary:
    calls: int
    lower_calls: int
    lower_call_share: float
    flops: int
    lower_flops: int
    lower_flop_share: float
    casts: int
    output_error: float | None
    first_nonfinite: str | None
    dtype: str
    policy: str
    # the matmul/conv FLOP share of each dtype they ran in, where a plan's fallback chain ran two 16-bit ones
    flop_share_by_dtype: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class InspectResult:
    records: list[OpRecord]
    summary: InspectSummary
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"records": [asdict(r) for r in self.records], "summary": asdict(self.summary)}


def relative_error(out: Any, ref: Any) -> float | None:
    """‖out − ref‖ / ‖ref‖ over every floating-point tensor of each, paired in order, in float64.

    Integer leaves (token ids, masks) are skipped: they carry no rounding error,
    and an output whose first tensor is `input_ids` would otherwise always
    score 0. None when the two do not pair up (another count or shape) or hold
    no floating-point tensor; NaN when the difference is NaN; inf when only
    the reference is zero.
    """
    a, b = float_leaves(out), float_leaves(ref)
    if not a or len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b, strict=False)):
        return None
    nums, denoms = [], []
    for x, y in zip(a, b, strict=False):
        y64 = y.detach().double()
        x64 = x.detach().to(device=y64.device, dtype=torch.float64)
        nums.append((x64 - y64).norm().item())
        denoms.append(y64.norm().item())
    if any(math.isnan(n) for n in nums):
        return float("nan")
    num, denom = math.hypot(*nums), math.hypot(*denoms)  # hypot: no overflow in the sum of squares
    if denom == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / denom


def _keep(t: Tensor) -> Tensor:
    """A copy a later in-place op (`relu_`, `+=`) cannot change; parameters are not copied, a forward
    does not write them, and copying every weight would double the model's memory."""
    return t.detach() if isinstance(t, nn.Parameter) else t.detach().clone()


def _cast_floats(x: Any, target: torch.dtype) -> Any:
    """`x` with its floating-point tensors (float64 excepted, as the engine never casts it) in `target`."""
    return map_tensors(x, lambda t: t.to(target) if t.is_floating_point() and t.dtype != torch.float64 else t)


def _all_finite(x: Any) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in float_leaves(x))


def _version(t: Tensor) -> int:
    try:
        return t._version  # bumped by every in-place write, shared with views
    except RuntimeError:  # inference tensors have no version counter
        return -1


class _Made:
    """The FP32 value each op output had when it was made, so that an in-place op on it
    (`relu_(bn_out)`, `out += x`) can be replayed on its input as it was before the op wrote it."""

    def __init__(self) -> None:
        self._made: dict[int, tuple[weakref.ref, int, Tensor]] = {}

    def add(self, out: Any, kept: Any) -> None:
        if isinstance(out, Tensor):
            self._made[id(out)] = (weakref.ref(out), _version(out), kept)

    def inputs_before(self, d: Decision, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        """(args, kwargs) to replay the op on; None when its input before the op is unknown."""
        rest = map_tensors(dict(kwargs), _keep)
        if not d.rule.mutates:
            return map_tensors(args, _keep), rest
        if d.rule not in (Rule.INPLACE, Rule.INPLACE_FIRST_INPUT) or not args or not isinstance(args[0], Tensor):
            return None  # `out=` ops write a tensor that is not an input
        written: Tensor = args[0]
        entry = self._made.get(id(written))
        if entry is None or entry[1] < 0 or _version(written) != entry[1] + 1 or entry[0]() is not written:
            return None  # not made by a recorded op, or written more than once since
        return (entry[2], *map_tensors(args[1:], _keep)), rest


def _sortable(value: float | None) -> float:
    """NaN (an overflow) ranks above everything, an unknown error below everything."""
    if value is None:
        return -1.0
    return math.inf if math.isnan(value) else value


def own_error_key(r: Any) -> tuple[float, float]:
    """The order of `top_records`: the error the op adds itself (`local_error`), then the error it
    carries (`error`), which also ranks calls that have no local error."""
    own = r.local_error if r.local_error is not None else r.error
    return _sortable(own), _sortable(r.error)


def top_records(records: list[OpRecord], n: int) -> list[OpRecord]:
    """The `n` calls that add the most error themselves, largest first. Numerically neutral calls
    (`OpRecord.adds_error` false: views, reshapes, permutes, eval dropout) are left out: their
    `local_error` is only the rounding of the input they were handed, which the op that made it added."""
    return sorted((r for r in records if r.adds_error), key=own_error_key, reverse=True)[:n]


def inspect_model(model: nn.Module, inputs: ModelInputs | tuple, policy: PolicyLike | None = None,
                  dtype: str | torch.dtype | None = None, *,
                  modules: Mapping[str, str] | None = None,
                  local_errors: bool = True) -> InspectResult:
    """Explain, per op call, the precision `policy` gives `model(*args, **kwargs)` and the error it adds.

    Args:
        inputs: a ModelInputs, or a tuple of positional args.
        policy: a preset name, a plan file or folder, a Plan or a Policy. None: the plan attached to
            `model` (`tuner.load`, `tuner.attach`), else torch-cpu.
        dtype: the lower dtype (`bf16`, `fp16`); the policy's own when None.
        modules: module path (or glob) -> dtype overrides, as for `tuner.autocast`.
        local_errors: also replay each op on the FP32 run's inputs (`OpRecord.local_error`).

    Returns:
        An InspectResult: one OpRecord per op call of the forward, and the summary.

    Each op's FP32 output (and, for `local_error`, its inputs) is copied when it
    is made, so an in-place op later in the forward (`F.relu(x, inplace=True)`
    after a BatchNorm) cannot change the reference it is compared against. The
    model's forward runs through `call_forward`, so a failure in it is a
    UserCodeError naming the user's line; a plan made for another model is
    refused (PlanMismatchError) before anything runs. An attached plan is detached while the passes run and
    attached again after; parameters a loaded model holds in bf16/fp16 are held in FP32 meanwhile (the
    reference is then FP32 compute on the stored weights: the original FP32 weights are not in the model).
    """
    lowered = {n: torch.float32 for n, p in model.named_parameters() if p.dtype in (torch.bfloat16, torch.float16)}
    with suspended(model) as held, stored_as(model, lowered if held is not None else {}):
        if policy is None and held is not None:
            policy, dtype = held.policy, dtype if dtype is not None else held.dtype
        return _inspect(model, inputs, "torch-cpu" if policy is None else policy, dtype, modules, local_errors)


def _inspect(model: nn.Module, inputs: ModelInputs | tuple, policy: PolicyLike, dtype: str | torch.dtype | None,
             modules: Mapping[str, str] | None, local_errors: bool) -> InspectResult:
    policy = as_plan(policy)  # a plan file is read (and checked against the model) once
    probe = autocast(policy, dtype, model=model, modules=modules, recorder=lambda *a: None, engine=EngineKind.PYTHON)
    call = ModelInputs.of(inputs)
    fp32_inputs, policy_inputs = call.snapshot(), call.snapshot()  # the forward may write its inputs
    run = functools.partial(autocast, policy, dtype, model=model, modules=modules, engine=EngineKind.PYTHON)
    reference = _reference_pass(model, fp32_inputs, run, local_errors)
    records: list[OpRecord] = []
    counter = ShareCounter()

    def record_policy(d: Decision, func: Callable[..., Any], args: tuple, kwargs: dict, out: Any, *raw: Any) -> None:
        records.append(reference.record(d, args, kwargs, out, func))
        counter.count(d, records[-1].flops)

    policy_run = run(recorder=record_policy)
    if policy_run.engine is not None:  # the model's code sees torch.autocast as deployed (`tuner.engine.regions`)
        policy_run.engine.as_deployed = True
    with torch.no_grad(), policy_run:
        output = call_forward(model, policy_inputs)
    first_bad = next((r.label for r in records if r.nonfinite
                      and _all_finite(reference.outputs.get((r.module, r.op, r.index)))), None)
    shares = counter.shares
    summary = InspectSummary(
        calls=shares.calls, lower_calls=shares.lower_calls, lower_call_share=shares.call_share,
        flops=shares.flops, lower_flops=shares.lower_flops, lower_flop_share=shares.flop_share,
        casts=sum(r.casts for r in records), output_error=relative_error(output, reference.output),
        first_nonfinite=first_bad, dtype=short_name(probe.dtype), policy=probe.policy.name,
        flop_share_by_dtype=shares.dtype_shares() if len(shares.by_dtype) > 1 else {})
    return InspectResult(records=records, summary=summary)


@dataclass
class _Reference:
    """What the FP32 pass leaves for comparing the policy's pass with: each call's output, and the
    op and inputs to replay it on (for `local_error`)."""

    outputs: dict[Key, Any] = field(default_factory=dict)
    replays: dict[Key, tuple[Callable[..., Any], tuple, dict]] = field(default_factory=dict)
    output: Any = None  # the model's FP32 output

    def record(self, d: Decision, args: tuple, kwargs: dict, out: Any,
               func: Callable[..., Any] | None = None) -> OpRecord:
        """The OpRecord of one call of the policy's pass, compared with the same call here. `dtype` is what its
        work computed in (`Decision.ran`: its kernel's, when that widened what it was cast to)."""
        key = (d.module, d.op, d.index)
        ref = self.outputs.get(key)
        o = first_tensor(out)
        return OpRecord(
            module=d.module, op=d.op, index=d.index, input_dtypes=d.in_dtype_names, dtype=short_name(d.ran),
            output_dtype=short_name(o.dtype) if o is not None else "-", rule=d.rule, reason=d.reason,
            casts=d.casts, flops=op_flops(d.op, args, kwargs, out),
            error=relative_error(out, ref) if ref is not None else None,
            local_error=self.local_error(d, key, ref) if ref is not None else None,
            nonfinite=not _all_finite(out), neutral=is_neutral(d.op, args, kwargs),
            kernel_note=kernel_note(d, func, args, kwargs) if func is not None else "")

    def local_error(self, d: Decision, key: Key, ref: Any) -> float | None:
        """The op re-run on the FP32 run's inputs in the dtype it computed in under the policy."""
        if key not in self.replays or d.compute not in _REPLAYABLE:
            return None
        rfunc, rargs, rkwargs = self.replays[key]
        target = d.compute
        rargs = _cast_floats(rargs, target)
        if d.rule.mutates:  # the op writes its first argument: never the kept FP32 value itself
            rargs = (rargs[0].clone(), *rargs[1:])
        try:
            return relative_error(rfunc(*rargs, **_cast_floats(rkwargs, target)), ref)
        except Exception:  # noqa: BLE001 - an op that cannot be replayed simply has no local error
            return None


def _reference_pass(model: nn.Module, inputs: ModelInputs, run: Callable[..., autocast],
                    local_errors: bool) -> _Reference:
    """The FP32 pass: the policy's engine in dry-run mode (same calls and indices, nothing cast)."""
    reference = _Reference()
    made = _Made()

    def record_ref(d: Decision, func: Callable[..., Any], args: tuple, kwargs: dict, out: Any, *raw: Any) -> None:
        key = (d.module, d.op, d.index)
        reference.outputs[key] = kept = detached_copy(out, _keep)
        if local_errors:
            replay = made.inputs_before(d, args, kwargs)
            if replay is not None:
                reference.replays[key] = (func, *replay)
            made.add(out, kept)

    with torch.no_grad(), run(recorder=record_ref, dry_run=True):
        reference.output = detached_copy(call_forward(model, inputs))
    return reference

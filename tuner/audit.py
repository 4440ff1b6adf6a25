"""`mpt inspect`: run the inputs once in FP32 and once under a policy, and explain every op call.

Each record says where the call was made (module path), what ran (op, input
dtypes, the dtype it computed in, output dtype), why (the rule), and what it
cost in accuracy: `error` is the relative error of its output against the
FP32 run's output at the same call (everything upstream included), and
`local_error` the error the op itself adds: it re-runs the op on the FP32
run's inputs with the same precision decision.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping

import torch
from torch import Tensor, nn

from .api import PolicyLike, as_plan, autocast
from .dtypes import LOWER_DTYPES, parse_dtype, short_name
from .engine import Decision
from .flops import first_tensor, op_flops
from .loader import call_forward
from .rules import Rule

_LOWER_NAMES = {short_name(d) for d in LOWER_DTYPES}


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

    @property
    def label(self) -> str:
        return f"{self.module or '(root)'}:{self.op}#{self.index}"


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


@dataclass(frozen=True)
class InspectResult:
    records: list[OpRecord]
    summary: InspectSummary
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"records": [asdict(r) for r in self.records], "summary": asdict(self.summary)}


def relative_error(out: Any, ref: Any) -> float | None:
    """‖out − ref‖ / ‖ref‖ on the first floating tensor of each (None when not comparable)."""
    a, b = first_tensor(out), first_tensor(ref)
    if a is None or b is None or a.shape != b.shape or not a.is_floating_point() or not b.is_floating_point():
        return None
    a64, b64 = a.detach().double(), b.detach().double()
    denom = b64.norm().item()
    num = (a64 - b64).norm().item()
    if math.isnan(num):
        return float("nan")
    if denom == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / denom


def _detach(x: Any) -> Any:
    if isinstance(x, Tensor):
        return x.detach()
    if isinstance(x, (list, tuple)):
        return type(x)(_detach(i) for i in x) if isinstance(x, tuple) else [_detach(i) for i in x]
    return x


def _cast_like(x: Any, target: torch.dtype) -> Any:
    if isinstance(x, Tensor) and x.is_floating_point() and x.dtype != torch.float64:
        return x.to(target)
    if isinstance(x, (list, tuple)):
        items = [_cast_like(i, target) for i in x]
        return tuple(items) if isinstance(x, tuple) else items
    return x


def inspect_model(model: nn.Module, inputs: tuple, policy: PolicyLike = "torch-cpu",
                  dtype: str | torch.dtype | None = None, *,
                  modules: Mapping[str, str] | None = None,
                  local_errors: bool = True) -> InspectResult:
    """Explain, per op call, the precision `policy` gives `model(*inputs)` and the error it adds.

    The model's forward runs through `call_forward`, so a failure in it is a
    UserCodeError naming the user's line; a plan made for another model is
    refused (PlanMismatchError) before anything runs.
    """
    policy = as_plan(policy)  # a plan file is read (and checked against the model) once
    probe = autocast(policy, dtype, model=model, modules=modules, recorder=lambda *a: None, engine="python")
    pol, lower = probe.policy, probe.dtype

    ref_out: dict[tuple[str, str, int], Any] = {}
    ref_in: dict[tuple[str, str, int], tuple[Callable[..., Any], tuple, dict]] = {}

    def record_ref(d: Decision, func: Callable[..., Any], args: tuple, kwargs: dict, out: Any, *raw: Any) -> None:
        key = (d.module, d.op, d.index)
        ref_out[key] = _detach(out)
        if local_errors:
            ref_in[key] = (func, _detach(args), {k: _detach(v) for k, v in kwargs.items()})

    with torch.no_grad(), autocast(policy, dtype, model=model, modules=modules, recorder=record_ref,
                                   engine="python", dry_run=True):
        fp32_output = call_forward(model, inputs)

    records: list[OpRecord] = []

    def record_policy(d: Decision, func: Callable[..., Any], args: tuple, kwargs: dict, out: Any, *raw: Any) -> None:
        key = (d.module, d.op, d.index)
        ref = ref_out.get(key)
        err = relative_error(out, ref) if ref is not None else None
        local = None
        if local_errors and key in ref_in and d.compute not in ("-",):
            rfunc, rargs, rkwargs = ref_in[key]
            try:
                target = parse_dtype(d.compute) if d.compute in ("bf16", "fp16", "fp32") else None
                if target is not None and not d.rule.mutates:
                    shadow = rfunc(*_cast_like(rargs, target), **{k: _cast_like(v, target) for k, v in rkwargs.items()})
                    local = relative_error(shadow, ref)
            except Exception:  # an op that cannot be replayed simply has no local error
                local = None
        o = first_tensor(out)
        nonfinite = bool(o is not None and o.is_floating_point() and not torch.isfinite(o).all().item())
        records.append(OpRecord(
            module=d.module, op=d.op, index=d.index, input_dtypes=d.in_dtypes, dtype=d.compute,
            output_dtype=short_name(o.dtype) if o is not None else "-", rule=d.rule, reason=d.reason,
            casts=d.casts, flops=op_flops(d.op, args, kwargs, out), error=err, local_error=local,
            nonfinite=nonfinite))

    with torch.no_grad(), autocast(policy, dtype, model=model, modules=modules, recorder=record_policy,
                                   engine="python"):
        output = call_forward(model, inputs)

    float_calls = [r for r in records if r.dtype != "-"]
    lower_calls = [r for r in float_calls if r.dtype in _LOWER_NAMES]
    flops = sum(r.flops for r in records)
    lower_flops = sum(r.flops for r in lower_calls)
    first_bad = next((r.label for r in records if r.nonfinite
                      and (ref_out.get((r.module, r.op, r.index)) is None
                           or bool(torch.isfinite(first_tensor(ref_out[(r.module, r.op, r.index)])).all()))), None)
    summary = InspectSummary(
        calls=len(float_calls), lower_calls=len(lower_calls),
        lower_call_share=len(lower_calls) / len(float_calls) if float_calls else 0.0,
        flops=flops, lower_flops=lower_flops, lower_flop_share=lower_flops / flops if flops else 0.0,
        casts=sum(r.casts for r in records), output_error=relative_error(output, fp32_output),
        first_nonfinite=first_bad, dtype=short_name(lower), policy=pol.name)
    return InspectResult(records=records, summary=summary)

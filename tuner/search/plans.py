"""The plans a tune tries and writes."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tuner.options.tune import Granularity, TuneOptions
from tuner.policy.plan import OpInstance, Plan
from tuner.search.candidates import Candidates


def plan_for(options: TuneOptions, found: Candidates | None, fp32: Iterable[OpInstance],
             fallback: Iterable[OpInstance] = (), **extra: Any) -> Plan:
    """The plan that runs the preset in the options' dtype with the `fp32` instances in FP32 but those in
    `fallback`, which run in the options' fallback dtype (a tune with a fallback chain: `fallback` is then
    recorded, with or without instances), and what every plan keeps FP32 (`found`'s `fp32_modules` and
    `fp32_calls`: what torch.autocast cannot run here; None: nothing)."""
    modules = found.fp32_modules if found is not None else {}
    kept = set(found.fp32_calls if found is not None else ())
    fp32 = set(fp32)
    other = set(fallback) - kept
    if other and options.fallback is None:
        raise ValueError("instances in a fallback dtype, but the tune has no --fallback")
    plan = Plan(dtype=options.dtype, preset=options.preset,  # type: ignore[arg-type]
                modules=tuple(sorted((p, "fp32") for p in modules)),
                fp32_instances=tuple(sorted((fp32 - other) | kept)), fallback=options.fallback,
                fallback_instances=tuple(sorted(other)), for_training=options.for_training, **extra)
    # `granularity: type` keeps op types FP32: a plan with those lists runs per call, as the list files run under
    # tuner.convert; as FP32 islands it would run a module's other ops FP32 too (issue 45: an attention's matmuls
    # beside its FP32 linears), not what the trial claimed or the lists run
    types = frozenset(i.op for i in fp32 - other)
    return plan.with_types_fp32(types) if types and options.granularity == Granularity.TYPE.value else plan

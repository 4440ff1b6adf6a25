"""The plans a tune tries and writes."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tuner.options.tune import TuneOptions
from tuner.policy.plan import OpInstance, Plan
from tuner.search.candidates import Candidates


def plan_for(options: TuneOptions, found: Candidates | None, fp32: Iterable[OpInstance], **extra: Any) -> Plan:
    """The plan that runs the preset in the options' dtype with the `fp32` instances in FP32, and what every plan
    keeps FP32 (`found`'s `fp32_modules` and `fp32_calls`: what torch.autocast cannot run here; None: nothing)."""
    modules = found.fp32_modules if found is not None else {}
    kept = found.fp32_calls if found is not None else ()
    return Plan(dtype=options.dtype, preset=options.preset,  # type: ignore[arg-type]
                modules=tuple(sorted((p, "fp32") for p in modules)),
                fp32_instances=tuple(sorted(set(fp32) | set(kept))), for_training=options.for_training, **extra)

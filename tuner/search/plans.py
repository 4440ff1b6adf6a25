"""The plans a tune tries and writes."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tuner.options.tune import TuneOptions
from tuner.policy.plan import OpInstance, Plan


def plan_for(options: TuneOptions, fp32_modules: Mapping[str, str], fp32: Iterable[OpInstance],
             **extra: Any) -> Plan:
    """The plan that runs the preset in the options' dtype with `fp32_modules` and the `fp32` instances in FP32."""
    return Plan(dtype=options.dtype, preset=options.preset,  # type: ignore[arg-type]
                modules=tuple(sorted((p, "fp32") for p in fp32_modules)),
                fp32_instances=tuple(sorted(fp32)), **extra)

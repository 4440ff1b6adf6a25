"""What the search reads off an engine `Decision`: the one place that knows how a Decision spells a dtype."""
from __future__ import annotations

from tuner.core.dtypes import LOWER_NAMES
from tuner.engine.function_mode import Decision

_LOWER_NAMES = frozenset(LOWER_NAMES)


def runs_low(decision: Decision) -> bool:
    """The call computed in a lower precision (bf16/fp16)."""
    return decision.compute in _LOWER_NAMES


def inputs_all_fp32(decision: Decision) -> bool:
    """The call had floating-point inputs, and every one of them was FP32."""
    return bool(decision.in_dtypes) and all(t == "fp32" for t in decision.in_dtypes)

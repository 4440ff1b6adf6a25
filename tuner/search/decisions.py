"""What the search reads off an engine `Decision`, named for the search's questions."""
from __future__ import annotations

import torch

from tuner.engine.function_mode import Decision


def runs_low(decision: Decision) -> bool:
    """The call computed in a lower precision (bf16/fp16)."""
    return decision.lowered


def inputs_all_fp32(decision: Decision) -> bool:
    """The call had floating-point inputs, and every one of them was FP32."""
    return bool(decision.in_dtypes) and all(t is torch.float32 for t in decision.in_dtypes)

"""What the search reads off an engine `Decision`, named for the search's questions."""
from __future__ import annotations

from tuner.engine.function_mode import Decision


def runs_low(decision: Decision) -> bool:
    """The call computed in a lower precision (bf16/fp16)."""
    return decision.lowered


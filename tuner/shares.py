"""How much of a forward pass runs in the lower precision: shares of op calls and of matmul/conv FLOPs.

`mpt inspect` computes these from its full per-call records (and an FP32
reference pass for the errors). `mpt tune`'s report only needs the two
shares, so `ShareCounter` counts them from the decisions of one recorded
forward under the plan, with no reference pass and no stored outputs: the
same pass that finds which parameters the checkpoint can store lowered
(`tuner.checkpoint.plan_pass`). The counting rules are `inspect_model`'s
summary's, so the report and `mpt inspect --plan` agree.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .dtypes import LOWER_DTYPES, short_name
from .engine import Decision
from .flops import op_flops

_LOWER_NAMES = frozenset(short_name(d) for d in LOWER_DTYPES)


@dataclass(frozen=True)
class Shares:
    """Op calls and FLOPs of one forward, and how many of them ran in the lower precision."""

    calls: int = 0
    lower_calls: int = 0
    flops: int = 0
    lower_flops: int = 0

    @property
    def call_share(self) -> float:
        return self.lower_calls / self.calls if self.calls else 0.0

    @property
    def flop_share(self) -> float:
        return self.lower_flops / self.flops if self.flops else 0.0


class ShareCounter:
    """An engine-recorder companion: call `add` with each Decision; `shares` is the running total.

    Counts like `inspect_model`'s summary: a call is a floating-point call when
    it computed in some dtype (compute != "-"), a lower call when that dtype
    is bf16/fp16; FLOPs are `op_flops` of every call, lower FLOPs those of
    the lower calls.
    """

    def __init__(self) -> None:
        self._calls = self._lower_calls = self._flops = self._lower_flops = 0

    def add(self, decision: Decision, args: tuple, kwargs: dict, out: Any) -> None:
        flops = op_flops(decision.op, args, kwargs, out)
        self._flops += flops
        if decision.compute == "-":
            return
        self._calls += 1
        if decision.compute in _LOWER_NAMES:
            self._lower_calls += 1
            self._lower_flops += flops

    @property
    def shares(self) -> Shares:
        return Shares(self._calls, self._lower_calls, self._flops, self._lower_flops)

"""How much of a forward pass runs in the lower precision: shares of op calls and of matmul/conv FLOPs.

The one definition every output uses (trial lines, the summary, report.json,
search.html, report.md): the lower-precision share of a forward is first its
FLOP share -- matmul/conv/RNN FLOPs (`tuner.measure.flops.op_flops`) computed in
bf16/fp16 over all FLOPs of the forward -- and second its call share -- op
calls computed in bf16/fp16 over all floating-point op calls. `Shares.text`
and `Shares.short` are how they are written.

A search trial's shares come without a forward of their own: the all-lower
forward that finds the candidates is counted once (`TuneSession.all_low`),
and a trial subtracts what its FP32 candidates take away (`Shares.without`).

`mpt inspect` computes these from its full per-call records (and an FP32
reference pass for the errors). `mpt tune`'s report only needs the two
shares, so `ShareCounter` counts them from the decisions of one recorded
forward under the plan, with no reference pass and no stored outputs: the
same pass that finds which parameters the checkpoint can store lowered
(`tuner.report.checkpoint.plan_pass`). The counting rules are `inspect_model`'s
summary's, so the report and `mpt inspect --plan` agree.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuner.core.dtypes import short_name
from tuner.engine.function_mode import Decision
from tuner.measure.flops import op_flops
from tuner.policy.rules import Rule


@dataclass(frozen=True)
class Shares:
    """Op calls and FLOPs of one forward, and how many of them ran in the lower precision."""

    calls: int = 0
    lower_calls: int = 0
    flops: int = 0
    lower_flops: int = 0
    model_flops: int = 0  # FLOPs in the model's own FP32 regions (`Rule.MODEL_FP32`): no plan can lower them
    # the lower FLOPs by the 16-bit dtype they ran in (`bf16`, `fp16`), sorted: two where a plan has a fallback
    # chain (`Plan.fallback`); empty where not counted (a trial's shares, `without`)
    by_dtype: tuple[tuple[str, int], ...] = ()

    @property
    def call_share(self) -> float:
        return self.lower_calls / self.calls if self.calls else 0.0

    @property
    def flop_share(self) -> float:
        return self.lower_flops / self.flops if self.flops else 0.0

    def without(self, calls: int, flops: int) -> Shares:
        """These shares with `calls` lower calls (of `flops` FLOPs) moved to FP32.

        The FLOP share this gives is the plan's: FLOPs come from matmul/conv-like ops, which run in the
        lower precision unless the plan keeps them FP32. The call share is an upper bound: ops that follow
        their inputs' precision turn FP32 downstream of an FP32 instance, which only a forward can tell.
        Trial lines therefore show the FLOP share; the plan's call share comes from a recorded forward
        (`tuner.report.checkpoint.plan_pass`)."""
        return Shares(self.calls, max(0, self.lower_calls - calls), self.flops, max(0, self.lower_flops - flops),
                      self.model_flops)

    def short(self) -> str:
        return short_text(self.flop_share)

    def dtype_shares(self) -> dict[str, float]:
        """Each 16-bit dtype's share of the matmul/conv FLOPs, then FP32's (the rest), by short name."""
        found = {name: n / self.flops if self.flops else 0.0 for name, n in self.by_dtype}
        found["fp32"] = max(0.0, 1.0 - self.flop_share) if self.flops else 0.0
        return found

    def text(self, dtype: str) -> str:
        """The summary's line; where two 16-bit dtypes ran (a fallback chain) the share is "16-bit", split by
        dtype: `97% of matmul/conv FLOPs (90% of op calls) in 16-bit (fp16 80%, bf16 17%)`."""
        kept = (f"; {percent(self.model_flops / self.flops)} of matmul/conv FLOPs kept FP32 by the model"
                if self.model_flops else "")
        if len([n for _, n in self.by_dtype if n]) > 1:
            split = ", ".join(f"{name} {percent(share)}" for name, share in self.dtype_shares().items()
                              if name != "fp32")
            return share_text(self.flop_share, self.call_share, "16-bit") + f" ({split})" + kept
        return share_text(self.flop_share, self.call_share, dtype) + kept

    def to_dict(self) -> dict[str, Any]:
        """The report.json keys of the plan's shares: `low_precision_*` count both 16-bit dtypes, and
        `flop_share_by_dtype` splits the matmul/conv FLOPs by the dtype they ran in (`16-bit`: their sum)."""
        by_dtype: dict[str, float] = {"16-bit": self.flop_share, **self.dtype_shares()}
        return {"low_precision_flop_share": self.flop_share, "low_precision_call_share": self.call_share,
                "model_fp32_flop_share": self.model_flops / self.flops if self.flops else 0.0,
                "flop_share_by_dtype": by_dtype}


class ShareCounter:
    """An engine-recorder companion: call `add` with each Decision; `shares` is the running total.

    `inspect_model`'s summary counts with it too: a call is a floating-point
    call when it computed in some dtype (`compute` is not None), a lower call
    when its work computed in bf16/fp16 (`Decision.ran_low`: its kernel's dtype, issue 40); FLOPs are `op_flops` of
    every call, lower FLOPs those of the lower calls.
    """

    def __init__(self) -> None:
        self._calls = self._lower_calls = self._flops = self._lower_flops = self._model_flops = 0
        self._by_dtype: dict[str, int] = {}

    def add(self, decision: Decision, args: tuple, kwargs: dict, out: Any) -> None:
        """Count one call (the recorder's arguments)."""
        self.count(decision, op_flops(decision.op, args, kwargs, out))

    def count(self, decision: Decision, flops: int) -> None:
        """Count one call whose FLOPs are known."""
        self._flops += flops
        if decision.rule is Rule.MODEL_FP32 or (decision.rule is Rule.MODEL_AUTOCAST and not decision.ran_low):
            self._model_flops += flops
        if decision.compute is None:
            return
        self._calls += 1
        if decision.ran_low:  # what its kernel computed in (`Decision.kernel`), not only what it was cast to
            self._lower_calls += 1
            self._lower_flops += flops
            name = short_name(decision.ran)
            self._by_dtype[name] = self._by_dtype.get(name, 0) + flops

    @property
    def shares(self) -> Shares:
        return Shares(self._calls, self._lower_calls, self._flops, self._lower_flops, self._model_flops,
                      tuple(sorted(self._by_dtype.items())))


def percent(share: float) -> str:
    """A share as a whole percentage, except that a share short of 1 never reads `100%` and one above 0
    never reads `0%`: decimals are added until it does not (`99.9%`), and past two it says `>99.99%`."""
    for decimals in range(3):
        text = f"{share:.{decimals}%}"
        if not ((0 < share < 1) and float(text[:-1]) in (0.0, 100.0)):
            return text
    return ">99.99%" if share > 0.5 else "<0.01%"


def short_text(flop_share: float) -> str:
    """For a trial line or a table cell: ` 62% FLOPs` (the FLOP share alone: see `Shares.without`)."""
    return f"{percent(flop_share):>4} FLOPs"


def share_text(flop_share: float, call_share: float, dtype: str) -> str:
    """For a summary: `62% of matmul/conv FLOPs (75% of op calls) in bf16`."""
    return f"{percent(flop_share)} of matmul/conv FLOPs ({percent(call_share)} of op calls) in {dtype}"

"""The range rule: op instances whose values leave the lower dtype's finite range stay FP32, found by forwards.

fp16 holds nothing past 65504. An op instance whose FP32 input or output on the example inputs goes past that
overflows in fp16 whatever the search does around it: its own cast turns an input into inf, or its result is
inf. And keeping the producer in FP32 is not enough (issue 39): a consumer that casts its inputs (a Linear
after the one that overflowed) casts the FP32 value to fp16 itself. So before any evaluation:

1. `RangeRecorder`: in an FP32 forward (every candidate FP32), each candidate's largest input and output
   magnitude (ModelOpt AutoCast's `data_max` rule, at zero evaluations); it rides on the gradient ranking's
   first pass, else `record_ranges` runs one forward for it;
2. `beyond_range`: every candidate whose input or output passes the lower dtype's largest finite value starts
   FP32, with the reason (`RangeReason`);
3. `first_overflow`: under the plan so far (those FP32, the rest low) a forward finds the first op whose output
   is not finite though its inputs are; the candidate that owns it (or, for an op that is no candidate, the
   last candidate that ran before it) joins the FP32 set; `follow_chains` repeats until a forward is finite.

Forwards on the example inputs only, never `evaluate`: the session times them as the `range` phase. Under bf16
(FP32's range) the rule fires only on values past 3.4e38, so it costs one forward and keeps nothing.
"""
from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from tuner.core.inputs import ModelInputs, tensor_leaves
from tuner.engine.function_mode import Decision, PrecisionEngine
from tuner.policy.plan import OpInstance
from tuner.policy.presets import Policy

_F32 = torch.float32
FILL = 1e30  # magnitudes from here up are fill values (a mask's finfo.min, -1e30), not data: not counted


class RangeSide(str, enum.Enum):
    """Which of an op's values leaves the lower dtype's range."""

    INPUT = "input"  # an input, in FP32, is past the range: the op's own cast makes it inf
    OUTPUT = "output"  # its FP32 result is past the range: computed low it is inf
    CHAIN = "chain"  # the values are in range in FP32, yet under the plan so far its output is the first inf


@dataclass(frozen=True)
class RangeReason:
    """Why the range rule keeps one op instance FP32: which side, the magnitude it reached (FP32, on the example
    inputs; inf for a chain's overflow) and the lower dtype's largest finite value."""

    side: RangeSide
    reached: float
    limit: float
    dtype: str

    def __post_init__(self) -> None:
        if not self.limit > 0 or math.isnan(self.reached):
            raise ValueError(f"a range reason needs a positive limit and a magnitude: {self}")

    def text(self) -> str:
        """`input reaches 1.2e+06 > fp16 max 65504`; for a chain, where its first non-finite value appeared."""
        if self.side is RangeSide.CHAIN:
            return (f"range rule: with the ops before it kept FP32, its output in {self.dtype} is the forward's "
                    "first non-finite value")
        return f"range rule: {self.side.value} reaches {self.reached:.3g} > {self.dtype} max {self.limit:.6g}"


@dataclass(frozen=True)
class Magnitude:
    """A candidate's largest absolute input and output value in one FP32 forward (0 when it had none)."""

    input: float
    output: float


def _data_peak(t: Tensor) -> Tensor:
    """`t`'s largest magnitude below FILL (an attention mask's finfo.min is no value an op computes with: in the
    lower dtype it becomes -inf and masks the same); inf when `t` holds an inf or NaN."""
    a = t.detach().abs()
    top = torch.where(a < FILL, a, torch.zeros((), dtype=a.dtype, device=a.device)).amax().to(_F32)
    return torch.where(torch.isfinite(a).all(), top, torch.full((), math.inf, device=a.device))


def _peak(tensors: Iterable[Any]) -> Tensor | None:
    """The largest magnitude of the floating-point tensors (`_data_peak`), as a 0-dim FP32 tensor on their
    device (read back once per forward, not once per op: no sync per op on a GPU); None without one."""
    peaks = [_data_peak(t) for t in tensors
             if isinstance(t, Tensor) and t.is_floating_point() and t.numel() and t.dtype != torch.float64]
    if not peaks:
        return None
    return peaks[0] if len(peaks) == 1 else torch.stack([p.to(peaks[0].device) for p in peaks]).amax()


def _read(peaks: list[Tensor]) -> list[float]:
    """The peaks (0-dim tensors) as numbers, in order: one read per device (stacked there, then copied once)."""
    by_device: dict[torch.device, list[int]] = {}
    for i, p in enumerate(peaks):
        by_device.setdefault(p.device, []).append(i)
    values = [0.0] * len(peaks)
    for at in by_device.values():
        for i, v in zip(at, torch.stack([peaks[i] for i in at]).cpu().tolist(), strict=True):
            values[i] = float(v)
    return values


@dataclass(frozen=True)
class Ranges:
    """What the FP32 forward saw: each candidate's `Magnitude`, and the op calls (module, op, index) whose output
    is not finite even in FP32 (a mask filled with -inf): no plan causes those, so chains skip them."""

    magnitudes: Mapping[OpInstance, Magnitude]
    nonfinite: frozenset[tuple[str, str, int]] = frozenset()


def _engine(policy: Policy, dtype: torch.dtype, model: nn.Module, fp32: Iterable[OpInstance],
            modules: Iterable[str], recorder: Callable[..., Any], fallback: Iterable[OpInstance] = (),
            fallback_dtype: torch.dtype = _F32) -> PrecisionEngine:
    overrides = {c.key(): fallback_dtype for c in fallback}
    overrides.update({c.key(): _F32 for c in fp32})
    return PrecisionEngine(policy, dtype, root=model, recorder=recorder,
                           module_overrides={p: _F32 for p in modules}, instance_overrides=overrides,
                           as_deployed=True)


class RangeRecorder:
    """A recorder for PrecisionEngine that keeps what `record_ranges` reports, for a forward another part of mpt
    runs with every candidate FP32 anyway (the gradient ranking's first pass: `rank_gradient(observer=...)`),
    so the range rule costs no forward of its own there. Peaks stay on the device until `ranges()`."""

    def __init__(self, candidates: Iterable[OpInstance]) -> None:
        self.wanted = {c.key(): c for c in candidates}
        self.ins: dict[OpInstance, list[Tensor]] = {}
        self.outs: dict[OpInstance, list[Tensor]] = {}
        self.inf_keys: list[tuple[str, str, int]] = []
        self.inf_flags: list[Tensor] = []
        self.ran = False

    def __call__(self, d: Decision, func: Any, args: tuple, kwargs: dict, out: Any, raw_args: tuple,
                 raw_kwargs: dict) -> None:
        self.ran = True
        key = (d.module, d.op, d.index)
        with torch.no_grad():
            peak = _peak(tensor_leaves(out))
            if peak is not None:
                self.inf_keys.append(key)
                self.inf_flags.append(~torch.isfinite(peak))
            cand = self.wanted.get(key)
            if cand is None:
                return
            into = _peak(t for a in (*raw_args, *raw_kwargs.values()) for t in tensor_leaves(a))
        if into is not None:
            self.ins.setdefault(cand, []).append(into)
        if peak is not None:
            self.outs.setdefault(cand, []).append(peak)

    def ranges(self) -> Ranges:
        """Every flag and peak read back in one transfer (a GPU syncs once, not once per candidate)."""
        seen_ = [c for c in self.wanted.values() if c in self.ins or c in self.outs]
        sides = [side.get(c, []) for c in seen_ for side in (self.ins, self.outs)]
        values = iter(_read([f.to(_F32) for f in self.inf_flags] + [p for side in sides for p in side]))
        flags = [next(values) for _ in self.inf_flags]
        peaks = [max((next(values) for _ in side), default=0.0) for side in sides]
        seen = {c: Magnitude(peaks[2 * i], peaks[2 * i + 1]) for i, c in enumerate(seen_)}
        return Ranges(seen, frozenset(k for k, f in zip(self.inf_keys, flags, strict=True) if f))


def record_ranges(model: nn.Module, inputs: ModelInputs, policy: Policy, dtype: torch.dtype,
                  candidates: Iterable[OpInstance], always: Iterable[OpInstance] = (),
                  modules: Iterable[str] = ()) -> Ranges:
    """One forward with every candidate (and `always`, the calls every plan keeps FP32, and `modules`) in FP32:
    each candidate's largest input and output magnitude, and the calls whose output is not finite."""
    recorder = RangeRecorder(candidates)
    with torch.no_grad(), _engine(policy, dtype, model, [*recorder.wanted.values(), *always], modules, recorder):
        inputs.call(model)
    return recorder.ranges()


def beyond_range(magnitudes: Mapping[OpInstance, Magnitude], dtype: torch.dtype,
                 dtype_name: str) -> dict[OpInstance, RangeReason]:
    """The candidates whose FP32 input or output passes `dtype`'s largest finite value, and why."""
    limit = float(torch.finfo(dtype).max)
    kept: dict[OpInstance, RangeReason] = {}
    for cand, m in magnitudes.items():
        if m.input > limit:
            kept[cand] = RangeReason(RangeSide.INPUT, m.input, limit, dtype_name)
        elif m.output > limit:
            kept[cand] = RangeReason(RangeSide.OUTPUT, m.output, limit, dtype_name)
    return kept


def first_overflow(model: nn.Module, inputs: ModelInputs, policy: Policy, dtype: torch.dtype,
                   candidates: list[OpInstance], fp32: Iterable[OpInstance], modules: Iterable[str] = (),
                   skip: frozenset[tuple[str, str, int]] = frozenset(), fallback: Iterable[OpInstance] = (),
                   fallback_dtype: torch.dtype = _F32) -> OpInstance | None:
    """Under the plan (`fp32` FP32, the other candidates low): the candidate to keep FP32 for the forward's first
    non-finite value (the op whose inputs are finite and output is not: itself when it is a candidate running
    low, else the last low candidate that ran before it; calls in `skip`, not finite in FP32 either, are no
    plan's doing); None when the forward stays finite or no low
    candidate ran before the first non-finite value. `fallback` run in `fallback_dtype` (a fallback chain)."""
    keep = set(fp32) | set(fallback)
    wanted = {c.key(): c for c in candidates if c not in keep}
    calls: list[tuple[OpInstance | None, int | None]] = []  # each call's candidate and where its flags are
    flags: list[Tensor] = []  # (output not finite, inputs finite) per call with a float output, on the device

    def record(d: Decision, func: Any, args: tuple, kwargs: dict, out: Any, raw_args: tuple,
               raw_kwargs: dict) -> None:
        if (d.module, d.op, d.index) in skip:
            return
        outs = [t for t in tensor_leaves(out) if t.is_floating_point()]
        at = None
        if outs:
            ins = [t for a in (*raw_args, *raw_kwargs.values()) for t in tensor_leaves(a) if t.is_floating_point()]
            bad = ~torch.stack([torch.isfinite(t).all().to(outs[0].device) for t in outs]).all()
            fine = torch.stack([torch.isfinite(t).all().to(outs[0].device) for t in ins]).all() if ins else \
                torch.ones((), dtype=torch.bool, device=outs[0].device)
            at = len(flags)
            flags.append(torch.stack([bad, fine]).to(_F32))
        calls.append((wanted.get((d.module, d.op, d.index)), at))

    with torch.no_grad(), _engine(policy, dtype, model, fp32, modules, record, fallback, fallback_dtype):
        inputs.call(model)
    read = _read([f[i] for f in flags for i in (0, 1)])  # one read after the forward: no sync per op on a GPU
    last: OpInstance | None = None
    for cand, at in calls:
        if at is not None and read[2 * at] and read[2 * at + 1]:
            return cand if cand is not None else last
        if cand is not None:
            last = cand
    return None


def follow_chains(model: nn.Module, inputs: ModelInputs, policy: Policy, dtype: torch.dtype,
                  candidates: list[OpInstance], kept: Mapping[OpInstance, RangeReason], dtype_name: str, *,
                  always: Iterable[OpInstance] = (), modules: Iterable[str] = (),
                  skip: frozenset[tuple[str, str, int]] = frozenset(), max_forwards: int = 64,
                  fallback_dtype: torch.dtype = _F32) -> tuple[dict[OpInstance, RangeReason], int]:
    """`kept` and the candidates `first_overflow` adds one forward at a time, until a forward is finite (or no
    candidate can be blamed, or `max_forwards` ran); and the forwards run. The kept candidates run in
    `fallback_dtype` (the other 16-bit dtype of a fallback chain, whose range holds them; FP32 by default)."""
    out = dict(kept)
    limit = float(torch.finfo(dtype).max)
    forwards = 0
    while forwards < max_forwards:
        forwards += 1
        cand = first_overflow(model, inputs, policy, dtype, candidates, list(always), modules, skip, out,
                              fallback_dtype)
        if cand is None or cand in out:
            break
        out[cand] = RangeReason(RangeSide.CHAIN, math.inf, limit, dtype_name)
    return out, forwards

"""`tuner.LossScaler`: torch.amp.GradScaler for an `evaluate` that trains in fp16, which fails the trial when the
scaler keeps skipping steps.

fp16 training needs loss scaling (small gradients underflow), and GradScaler needs FP32 master weights (it
refuses to unscale fp16 gradients): a training tune (`for_training`) keeps every parameter FP32, so the plain
pattern works under each trial's plan. What GradScaler hides is a plan whose fp16 ops overflow: it skips every
step whose gradients hold an inf or NaN and lowers the scale, and a model that never trains still returns a
metric. LossScaler counts the steps skipped in a row and raises `StepsSkipped` past `max_skipped`, so the
trial fails with that reason in the report instead of passing or failing for an unseen cause.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from tuner.core.errors import DeviceError

__all__ = ["LossScaler", "StepsSkipped", "ScalerSummary", "watching"]


class StepsSkipped(RuntimeError):
    """The loss scaler skipped `max_skipped` optimizer steps in a row: inf/NaN gradients at every scale."""


class LossScaler(torch.amp.GradScaler):
    """A torch.amp.GradScaler (same arguments; `device` first, "cuda" by default) that raises StepsSkipped when
    `max_skipped` steps in a row found inf/NaN gradients. The default, 24, lets the scale fall from 2**16 to
    below 2**-7 first: past that, gradients overflow unscaled, and no scale makes the plan train. It reads the
    inf flags `step` itself has just synchronised on, so it adds no wait of its own."""

    def __init__(self, device: str = "cuda", *args: Any, max_skipped: int = 24, **kwargs: Any) -> None:
        _check_device(device, args[4] if len(args) > 4 else kwargs.get("enabled", True))  # GradScaler's order
        super().__init__(device, *args, **kwargs)
        if max_skipped < 1:
            raise ValueError(f"max_skipped: expected an integer >= 1, found {max_skipped!r}")
        self.device_type = device if isinstance(device, str) else torch.device(device).type
        self.max_skipped = max_skipped
        self.skipped_in_a_row = 0
        self.skipped = 0
        self.steps = 0
        with _LOCK:
            for seen in _WATCHING:
                seen.append(self)

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        out = super().step(optimizer, *args, **kwargs)
        if not self.is_enabled():
            return out
        self.steps += 1
        found = self._per_optimizer_states[id(optimizer)].get("found_inf_per_device", {})
        if any(bool(v.item()) for v in found.values()):
            self.skipped += 1
            self.skipped_in_a_row += 1
            if self.skipped_in_a_row >= self.max_skipped:
                raise StepsSkipped(f"the loss scaler skipped {self.skipped_in_a_row} optimizer steps in a row "
                                   f"(inf/NaN gradients at every scale tried, the last {self.get_scale():.3g}): the "
                                   "plan's lower-precision ops overflow in training")
        else:
            self.skipped_in_a_row = 0
        return out


def _check_device(device: str, enabled: Any) -> None:
    """DeviceError (exit 2) for a scaler asked for a device this machine lacks: GradScaler would only warn and
    turn itself off, so every step would go unscaled and the skipped-steps guard would never fire. An explicit
    `enabled=False` is honoured (a script that scales only where the device is there)."""
    kind = torch.device(device).type
    if not enabled or kind == "cpu":
        return
    available = getattr(torch, kind, None)
    is_available = getattr(available, "is_available", None)
    if callable(is_available) and not is_available():
        raise DeviceError(f"tuner.LossScaler({device!r}): this machine has no {kind.upper()} device, so the "
                          "scaler would be off (no loss scaling, no skipped-steps guard); give the device the "
                          "model trains on (LossScaler(\"cpu\") here), or enabled=False")


@dataclass(frozen=True)
class ScalerSummary:
    """What the enabled `LossScaler`s one evaluate made did, together: `steps` optimizer steps, `skipped` of them
    skipped (inf/NaN gradients), the `scale` the last one ended at, on `device` ("cpu", "cuda"). The report shows
    the chosen trial's (a plan whose scale collapsed, or that skips many steps, trains less than its metric says),
    and report.md's training loop scales the loss as the trials did."""

    steps: int
    skipped: int
    scale: float
    device: str

    def text(self) -> str:
        """`2 of 40 optimizer steps skipped, final scale 32768`."""
        return f"{self.skipped} of {self.steps} optimizer steps skipped, final scale {self.scale:g}"

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "skipped": self.skipped, "scale": self.scale, "device": self.device}

    @classmethod
    def from_dict(cls, data: Any) -> ScalerSummary | None:
        """The summary a journal line holds; None for anything else (a line from before it, or none)."""
        if not isinstance(data, Mapping):
            return None
        try:
            return cls(int(data["steps"]), int(data["skipped"]), float(data["scale"]), str(data["device"]))
        except (KeyError, TypeError, ValueError):
            return None

    @classmethod
    def joined(cls, summaries: list[ScalerSummary | None]) -> ScalerSummary | None:
        """One trial's training runs together (`--seeds`): their steps and skipped steps summed, the last run's
        scale and device; None when no run made a scaler."""
        found = [s for s in summaries if s is not None]
        if not found:
            return None
        return cls(sum(s.steps for s in found), sum(s.skipped for s in found), found[-1].scale, found[-1].device)

    @classmethod
    def of(cls, scalers: list[LossScaler]) -> ScalerSummary | None:
        """The enabled `scalers` (in the order made) summed; None when there is none."""
        on = [s for s in scalers if s.is_enabled()]
        if not on:
            return None
        return cls(sum(s.steps for s in on), sum(s.skipped for s in on), float(on[-1].get_scale()),
                   on[-1].device_type)


_LOCK = threading.Lock()
_WATCHING: list[list[LossScaler]] = []  # one list per `watching` block open: the scalers made meanwhile


@contextlib.contextmanager
def watching() -> Iterator[list[LossScaler]]:
    """The LossScalers made while the block runs (any thread: a training loop may run in one of its own), in
    the order made: what the evaluator summarises for each evaluate (`ScalerSummary.of`)."""
    seen: list[LossScaler] = []
    with _LOCK:
        _WATCHING.append(seen)
    try:
        yield seen
    finally:
        with _LOCK:
            del _WATCHING[next(i for i, s in enumerate(_WATCHING) if s is seen)]

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

from typing import Any

import torch

from tuner.core.errors import DeviceError

__all__ = ["LossScaler", "StepsSkipped"]


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
        self.max_skipped = max_skipped
        self.skipped_in_a_row = 0
        self.skipped = 0

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        out = super().step(optimizer, *args, **kwargs)
        if not self.is_enabled():
            return out
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

"""Parameters held in a lower dtype, changed one parameter at a time from one plan to the next.

A trial runs the model with the parameters its checkpoint stores lowered held lowered (`deployed.stored_as`).
On a large model, lowering them and putting the FP32 bits back costs seconds per trial (1.1B parameters:
about 1.4 s each way), though consecutive trials mostly store the same parameters lowered. `HeldLowered`
keeps what one plan lowered and, for the next, changes only the parameters whose dtype differs; the model
keeper (`tuner.workspace.keeper`) keeps it between loans and puts every FP32 tensor back before lending the
model as built.

A bf16 parameter is packed into its own storage where it can be (`tuner.measure.packed`: no second copy, the
FP32 bits rebuilt exactly); any other is held lowered in a new tensor, its FP32 tensor kept aside. A sharded
model's parameters (DTensors) stay FP32 (`deployed.stored_as` says why).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn

from tuner.core.sharding import is_dtensor
from tuner.measure.packed import Scratch, pack

Undo = Callable[[Scratch], None]  # puts one parameter's FP32 tensor back (buffers to reuse: `packed.Scratch`)


def _aside(p: nn.Parameter, dtype: torch.dtype) -> Undo:
    """Hold `p` in `dtype` in a new tensor; the undo puts the FP32 tensor back."""
    kept = p.data
    p.data = kept.to(dtype)

    def undo(_: Scratch) -> None:
        p.data = kept

    return undo


class HeldLowered:
    """Which parameters of one model are held lowered now (name -> dtype), and how to put each back."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[torch.dtype, Undo]] = {}

    @property
    def dtypes(self) -> dict[str, torch.dtype]:
        return {name: dtype for name, (dtype, _) in self._held.items()}

    def match(self, model: nn.Module, dtypes: Mapping[str, torch.dtype]) -> list[nn.Parameter]:
        """Hold exactly the parameters of `dtypes` lowered (as far as they can be: a DTensor or a parameter
        already in its dtype is left as it is); returns the parameters changed (none: nothing to do)."""
        changed: list[nn.Parameter] = []
        if not self._held and not dtypes:  # nothing held, nothing wanted: the usual loan of the model as built
            return changed
        params = dict(model.named_parameters())
        scratch = Scratch()  # one set of buffers for every parameter changed here
        with torch.no_grad():
            for name in reversed(list(self._held)):  # put back first: its bytes may be packed again below
                dtype, undo = self._held[name]
                if dtypes.get(name) != dtype:
                    undo(scratch)
                    del self._held[name]
                    changed.append(params[name])
            for name, p in params.items():
                want = dtypes.get(name)
                if want is None or name in self._held or p.dtype == want or is_dtensor(p):
                    continue
                self._held[name] = (want, pack(p, want, scratch) or _aside(p, want))
                changed.append(p)
        return changed

    def release(self) -> bool:
        """Every FP32 tensor back, bit for bit; True when anything was held."""
        held = bool(self._held)
        scratch = Scratch()
        with torch.no_grad():
            for name in reversed(list(self._held)):
                self._held.pop(name)[1](scratch)
        return held

    def forget(self) -> None:
        """Drop the record without putting anything back: the model it was made for is gone."""
        self._held.clear()

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

Except a parameter whose FP32 bytes are a file's pages mapped into memory (an `hf:` folder's safetensors, as
transformers loads them, copy-on-write): packing it in place would copy every page of it into the process's own
memory at the first write (GPT-2 774M: 690k page faults, most of a packing's time) and leave the model twice in
memory, the file's pages and the copy (a shared mapping's writes would reach the file; a read-only one's fail).
It is held in a lowered copy instead, made once and kept while the record lives: the next plan that holds it
lowered again (the report's verifying forward and checkpoint, after the result phase's FP32 forwards) gets the
same copy back at the cost of a checksum (which catches a write to it made while it was not held), where
packing in place would have unpacked and packed it again.
"""
from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor, nn

from tuner.core.fingerprint import tensor_checksum
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


class _Copy(NamedTuple):
    """A mapped parameter's lowered copy: of which FP32 tensor (its storage, offset, shape), in which dtype."""

    source: tuple[int, int, tuple[int, ...]]
    dtype: torch.dtype
    low: Tensor
    checksum: int


def _source(t: Tensor) -> tuple[int, int, tuple[int, ...]]:
    return t.untyped_storage().data_ptr(), int(t.storage_offset()), tuple(t.shape)


class _FileMappings:
    """The address ranges of the files this process maps (Linux's /proc/self/maps; none elsewhere), read at
    the first question."""

    def __init__(self) -> None:
        self._starts: list[int] | None = None
        self._ends: list[int] = []

    def holds(self, t: Tensor) -> bool:
        if t.device.type != "cpu" or t.numel() == 0:
            return False
        if self._starts is None:
            ranges = sorted(_mapped_files())
            self._starts, self._ends = [lo for lo, _ in ranges], [hi for _, hi in ranges]
        at = bisect.bisect_right(self._starts, t.data_ptr()) - 1
        return at >= 0 and t.data_ptr() < self._ends[at]


def _mapped_files() -> list[tuple[int, int]]:
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split(maxsplit=5)  # address perms offset device inode [path]
        if len(fields) == 6 and fields[5].startswith("/"):  # shared too: packing would write into the file
            lo, hi = fields[0].split("-")
            found.append((int(lo, 16), int(hi, 16)))
    return found


class HeldLowered:
    """Which parameters of one model are held lowered now (name -> dtype), and how to put each back."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[torch.dtype, Undo]] = {}
        self._copies: dict[str, _Copy] = {}  # the lowered copies of mapped parameters (module docstring)

    def _copy(self, name: str, p: nn.Parameter, dtype: torch.dtype) -> Undo:
        """Hold mapped `p` in its lowered copy, made now or kept from an earlier plan (and unchanged since)."""
        kept = p.data
        copy = self._copies.get(name)
        if copy is None or copy.source != _source(kept) or copy.dtype != dtype \
                or tensor_checksum(copy.low) != copy.checksum:
            low = kept.to(dtype)
            copy = self._copies[name] = _Copy(_source(kept), dtype, low, tensor_checksum(low))
        p.data = copy.low

        def undo(_: Scratch) -> None:
            p.data = kept

        return undo

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
        scratch, mapped = Scratch(), _FileMappings()  # one set of buffers for every parameter changed here
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
                self._held[name] = (want, self._copy(name, p, want) if mapped.holds(p.data) else
                                    pack(p, want, scratch) or _aside(p, want))
                changed.append(p)
        return changed

    def known_checksums(self, model: nn.Module) -> dict[int, int]:
        """id(parameter) -> the checksum of its bytes (`fingerprint.tensor_checksum`), for the parameters held
        in a lowered copy now: computed when the copy was made or last checked, so a capture of the model
        right after `match` reads none of those bytes again."""
        known = {}
        for name, p in model.named_parameters():
            copy = self._copies.get(name)
            if copy is not None and name in self._held and p.dtype == copy.dtype \
                    and p.data_ptr() == copy.low.data_ptr():
                known[id(p)] = copy.checksum
        return known

    def release(self) -> bool:
        """Every FP32 tensor back, bit for bit; True when anything was held."""
        held = bool(self._held)
        scratch = Scratch()
        with torch.no_grad():
            for name in reversed(list(self._held)):
                self._held.pop(name)[1](scratch)
        self._copies.clear()
        return held

    def forget(self) -> None:
        """Drop the record without putting anything back: the model it was made for is gone."""
        self._held.clear()
        self._copies.clear()

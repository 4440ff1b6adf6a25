"""The torch.autocast state `tuner.load` gives a model's own code, module by module, for mpt's engine to give it too.

A model's code may read torch.autocast's state and run differently by it. transformers 5.x's rotary embeddings
(Llama, Mistral, Qwen2...) compute their frequencies in `maybe_autocast(device_type, enabled=False)`, which opens
a `torch.autocast(enabled=False)` block only when autocast is already on for that device and a `nullcontext()`
otherwise (issue 44). The deployed model runs under torch.autocast (`tuner.engine.native`): there the block
exists and the rotary matmul runs FP32. mpt's engine casts per op with torch.autocast off: there it would not
exist, the engine's lists would lower that matmul, and the report would claim bf16 for what runs FP32.

So the engine's measuring forwards (the report's claims and shares, the search's candidates, ranking and
ranges) run with torch.autocast on where `tuner.load` has it on, and off where it has it off (the plan's FP32
subtrees on the native path, the modules under mpt's engine on the scoped path): the model's code sees the
state it sees deployed, opens the blocks it opens deployed, and the engine's `Rule.MODEL_FP32` /
`Rule.MODEL_AUTOCAST` then claim what those blocks run. An FP32 island's own code (a module owning FP32 op
instances) keeps autocast on here: deployed it runs with autocast off and every op of its own FP32, which the
engine runs by the plan's instances only (a tuned plan lists all of them: `tuner.search.candidates`). With
autocast off there, a conditional block would be absent and the engine would lower what it holds; with it on,
the block keeps it FP32, as the island does deployed. The engine keeps deciding every other op itself: its
own calls run with torch.autocast's dispatch keys excluded (`plain_keys`), so only the model's own autocast
blocks are cast by torch.autocast, as in every trial.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase

import torch
from torch import nn

from tuner.engine import native
from tuner.policy.modes import NativeDevice
from tuner.policy.presets import Policy


def native_device(pol: Policy) -> NativeDevice | None:
    """The device whose torch.autocast `pol` can run as: its `native` device when this machine has it, else None."""
    if pol.native is NativeDevice.CPU or (pol.native is NativeDevice.CUDA and torch.cuda.is_available()):
        return pol.native
    return None


@dataclass(frozen=True)
class DeployedAutocast:
    """Where the deployed model's code runs with torch.autocast(`device`, `dtype`) on, as the engine gives it:
    everywhere but under the modules in `off` (the native path's FP32 subtrees; on the scoped path the modules
    mpt's engine runs, autocast off). FP32 islands keep it on (see the module docstring)."""

    device: str
    dtype: torch.dtype
    off: frozenset[str] = frozenset()

    def on_at(self, path: str) -> bool:
        """torch.autocast is on in the own code of the module at `path` (as the engine gives it)."""
        return not any(path == r or r == "" or path.startswith(r + ".") for r in self.off)

    @property
    def uniform(self) -> bool:
        """On everywhere: no module switches it."""
        return not self.off


def deployed_autocast(model: nn.Module | None, policy: Policy, dtype: torch.dtype,
                      module_overrides: Mapping[str, torch.dtype],
                      instance_overrides: Mapping[tuple[str, str, int], torch.dtype],
                      device: str | None = None) -> DeployedAutocast | None:
    """How `tuner.attach(model, plan)` runs these overrides under torch.autocast here (`tuner.engine.attach`):
    None when it runs no torch.autocast (mpt's engine throughout: a policy with no native device here).
    `device` names the native device instead of this machine's (the CPU suite runs CUDA's configuration)."""
    own = native_device(policy)
    found = device if device is not None else own.value if own is not None else None
    if found is None or model is None:
        return None
    realized = native.realize(model, found, dtype, module_overrides, instance_overrides)
    if isinstance(realized, native.Execution):
        return DeployedAutocast(found, dtype, frozenset(realized.fp32_subtrees))
    return DeployedAutocast(found, dtype, frozenset(scoped_modules(model, module_overrides, instance_overrides)))


def scoped_modules(model: nn.Module, module_overrides: Mapping[str, torch.dtype],
                   instance_overrides: Mapping[tuple[str, str, int], torch.dtype]) -> set[str]:
    """The outermost modules the scoped path runs under mpt's engine (autocast off): those that own an instance
    override or match a module override; the engine follows their children itself."""
    owners = {key[0] for key in instance_overrides}
    paths = [p for p, _ in model.named_modules()]
    scoped = {p for p in paths if p in owners or any(p == q or fnmatchcase(p, q) for q in module_overrides)}
    return {p for p in scoped if not any(p != q and (q == "" or p.startswith(q + ".")) for q in scoped)}


# torch.autocast's dispatch keys per device type: excluded around the engine's own op calls (see the docstring)
_KEYS = {"cpu": torch._C.DispatchKey.AutocastCPU, "cuda": torch._C.DispatchKey.AutocastCUDA}


def plain_keys(device: str) -> torch._C.DispatchKeySet:
    """The dispatch keys whose exclusion makes an op run as if torch.autocast(`device`) were off."""
    return torch._C.DispatchKeySet(_KEYS[device])

"""torch's process-wide settings that user code can leave changed: snapshot, compare, put back.

A tune runs every evaluation with the settings mpt started with, so a trial cannot score differently
because an earlier `evaluate` (or `build_model`) left `torch.set_default_dtype(torch.float64)`,
`torch.set_grad_enabled(False)`, an entered `torch.autocast` or `torch.set_num_threads(1)` behind.
`StateGuard` keeps the snapshot, puts it back after each piece of user code and remembers what had
changed, for one warning at the end of the run.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tuner.core.errors import ConfigError, UserCodeError

AUTOCAST_DEVICES = ("cpu", "cuda")


def _autocast_devices() -> tuple[str, ...]:
    return tuple(d for d in AUTOCAST_DEVICES if d == "cpu" or torch.cuda.is_available())


def active_autocast() -> tuple[str, ...]:
    """The device types whose torch.autocast is on now (cheap: for a forward hook)."""
    return tuple(d for d in _autocast_devices() if torch.is_autocast_enabled(d))


def autocast_nesting() -> int:
    """How many torch.autocast blocks are open (torch has no getter: one step up and back down tells).

    An autocast entered and never exited leaves this above zero, and then autocast keeps its cache of cast
    weights across blocks: a later forward would reuse casts of tensors that may since have been replaced.
    """
    level = torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    return level


# torch.nn's process-wide module hooks (`register_module_forward_hook` and its kin): one registry each.
_HOOK_REGISTRIES = ("_global_forward_pre_hooks", "_global_forward_hooks", "_global_forward_hooks_with_kwargs",
                    "_global_forward_hooks_always_called", "_global_backward_pre_hooks", "_global_backward_hooks",
                    "_global_module_registration_hooks", "_global_parameter_registration_hooks",
                    "_global_buffer_registration_hooks")

Hooks = tuple[tuple[str, tuple[tuple[int, object], ...]], ...]


def _global_hooks() -> Hooks:
    """Every global module hook registry's (handle id, hook) items, mpt's own left out (its module tracker and
    RNN-input hooks come and go with its engine)."""
    from torch.nn.modules import module

    found = []
    for name in _HOOK_REGISTRIES:
        registry = getattr(module, name, None)
        if isinstance(registry, dict):
            found.append((name, tuple((k, v) for k, v in registry.items() if not _is_mpts(v))))
    return tuple(found)


def _is_mpts(hook: object) -> bool:
    owner = getattr(hook, "__module__", None) or getattr(getattr(hook, "__func__", None), "__module__", "")
    return isinstance(owner, str) and owner.startswith("tuner.")


def _restore_hooks(hooks: Hooks) -> None:
    """Each registry as `hooks` had it (mpt's own hooks kept as they are now)."""
    from torch.nn.modules import module

    for name, items in hooks:
        registry = getattr(module, name)
        ours = {k: v for k, v in registry.items() if _is_mpts(v)}
        registry.clear()
        registry.update(dict(items))
        registry.update(ours)


def _short(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@dataclass(frozen=True)
class TorchState:
    """The settings of the calling thread and process that change how a forward computes."""

    default_dtype: torch.dtype
    grad_enabled: bool
    autocast: tuple[tuple[str, bool, torch.dtype], ...]  # (device type, enabled, its lower dtype)
    num_threads: int
    autocast_nesting: int = 0  # open torch.autocast blocks (autocast_nesting())
    hooks: Hooks = ()  # the global module hooks (`_global_hooks`), compared by identity

    @classmethod
    def capture(cls) -> TorchState:
        return cls(torch.get_default_dtype(), torch.is_grad_enabled(),
                   tuple((d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in _autocast_devices()),
                   torch.get_num_threads(), autocast_nesting(), _global_hooks())

    def with_hooks(self, now: TorchState) -> TorchState:
        """This state with `now`'s global module hooks: those `build_model()` registers belong to the model."""
        return TorchState(self.default_dtype, self.grad_enabled, self.autocast, self.num_threads,
                          self.autocast_nesting, now.hooks)

    def active_autocast(self) -> tuple[str, ...]:
        """The device types whose torch.autocast is on."""
        return tuple(d for d, on, _ in self.autocast if on)

    def diff(self, now: TorchState) -> list[str]:
        """What differs in `now` from this snapshot, one phrase per setting (`default dtype float32 -> float64`)."""
        out = []
        if now.default_dtype != self.default_dtype:
            out.append(f"default dtype {_short(self.default_dtype)} -> {_short(now.default_dtype)} "
                       "(torch.set_default_dtype)")
        if now.grad_enabled != self.grad_enabled:
            out.append(f"grad mode {'on' if self.grad_enabled else 'off'} -> {'on' if now.grad_enabled else 'off'} "
                       "(torch.set_grad_enabled)")
        for (dev, on, dtype), (_, on2, dtype2) in zip(self.autocast, now.autocast, strict=False):
            if on != on2 or (on2 and dtype != dtype2):
                was = f"on ({_short(dtype)})" if on else "off"
                out.append(f"torch.autocast({dev}) {was} -> {f'on ({_short(dtype2)})' if on2 else 'off'} "
                           "(an autocast entered and not exited)")
        if now.autocast_nesting != self.autocast_nesting and not any("autocast" in o for o in out):
            out.append(f"open torch.autocast blocks {self.autocast_nesting} -> {now.autocast_nesting} "
                       "(an autocast entered and not exited)")
        if now.num_threads != self.num_threads:
            out.append(f"threads {self.num_threads} -> {now.num_threads} (torch.set_num_threads)")
        out += _hook_changes(self.hooks, now.hooks)
        return out

    def restore(self) -> None:
        """Make the current settings this snapshot's."""
        torch.set_default_dtype(self.default_dtype)
        torch.set_grad_enabled(self.grad_enabled)
        for dev, on, dtype in self.autocast:
            if torch.is_autocast_enabled(dev) != on or torch.get_autocast_dtype(dev) != dtype:
                torch.set_autocast_enabled(dev, on)
                torch.set_autocast_dtype(dev, dtype)
                torch.clear_autocast_cache()
        if torch.get_num_threads() != self.num_threads:
            torch.set_num_threads(self.num_threads)
        if _global_hooks() != self.hooks:
            _restore_hooks(self.hooks)
        nesting = autocast_nesting()
        while nesting > self.autocast_nesting:  # close what was left open; the cache goes with the last block
            nesting = torch.autocast_decrement_nesting()
            if nesting == 0:
                torch.clear_autocast_cache()


def _hook_changes(before: Hooks, now: Hooks) -> list[str]:
    """`3 global forward hook(s) added (torch.nn.modules.module.register_module_forward_hook)`, per registry."""
    out = []
    for (name, items), (_, items2) in zip(before, now, strict=False):
        added = len({id(v) for _, v in items2} - {id(v) for _, v in items})
        removed = len({id(v) for _, v in items} - {id(v) for _, v in items2})
        kind = name.removeprefix("_global_").replace("_", " ").removesuffix("s")
        for count, what in ((added, "added"), (removed, "removed")):
            if count:
                out.append(f"{count} global {kind}(s) {what} (torch.nn.modules.module.register_module_*)")
    return out


def refuse_active_autocast(what: str = "a tune") -> TorchState:
    """The current state; ConfigError when a torch.autocast is on (the "FP32 baseline" would not be FP32)."""
    state = TorchState.capture()
    active = state.active_autocast()
    if active:
        raise ConfigError(f"{what} was started inside an active torch.autocast({active[0]}): the FP32 baseline "
                          "would run in a lower precision; start it outside the `with torch.autocast(...)` block")
    return state


class StateGuard:
    """The settings a run started with, put back after each piece of user code (`restore`); `warning()` says
    once what user code had changed."""

    def __init__(self, start: TorchState | None = None) -> None:
        self.start = start or TorchState.capture()
        self.leaked: dict[str, str] = {}  # change -> the user code that first made it

    def restore(self, who: str, *, keep_hooks: bool = False) -> bool:
        """Put back the start state after `who` (`evaluate`, `build_model()`) ran; True when it had changed.

        `keep_hooks`: the global module hooks `who` registered are the model's own (`build_model()`: a model
        that hooks every module runs so wherever it is built), kept for every later call; those any other
        user code leaves behind (an `evaluate` that registers one per call) are removed, so each evaluation
        and each of mpt's own forwards runs with the hooks the model has, not with every earlier call's."""
        now = TorchState.capture()
        if keep_hooks:
            self.start = self.start.with_hooks(now)
        changes = self.start.diff(now)
        if not changes:
            return False
        self.start.restore()
        for change in changes:
            self.leaked.setdefault(change, who)
        return True

    def warning(self) -> str | None:
        """One line about every setting user code left changed, or None."""
        if not self.leaked:
            return None
        whos = " and ".join(dict.fromkeys(self.leaked.values()))
        return (f"{whos} changed torch's global state and did not put it back: {'; '.join(self.leaked)}. mpt "
                "restored it after every call, so the baseline and every trial ran with the state the tune "
                "started with")


def check_fp32_model(model: nn.Module, who: str = "build_model()", where: str | None = None) -> None:
    """UserCodeError when a parameter or buffer of `model` is in a lower precision (bf16, fp16, fp8): mpt tunes
    an FP32 model and would take it as the FP32 baseline. float64, complex and integer tensors are the model's
    own (a centering constant, a step counter, spectral weights): no plan lowers them, as torch.autocast
    leaves them, and the checkpoint keeps them bit for bit."""
    other: dict[torch.dtype, list[str]] = {}
    for kind, items in (("parameter", model.named_parameters()), ("buffer", model.named_buffers())):
        for name, t in items:
            if t.is_floating_point() and t.dtype not in (torch.float32, torch.float64):
                other.setdefault(t.dtype, []).append(f"{kind} {name}")
    if not other:
        return
    dtype, names = max(other.items(), key=lambda kv: len(kv[1]))
    count = sum(len(v) for v in other.values())
    raise UserCodeError(f"{who} returned a model with {count} floating parameter(s)/buffer(s) not in float32 "
                        f"({len(names)} in {_short(dtype)}, first: {names[0]}): mpt tunes an FP32 model and takes "
                        f"it as the FP32 baseline; return it in float32 (drop the .to({_short(dtype)}) / .half() "
                        "/ .bfloat16())", where=where)

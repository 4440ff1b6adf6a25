"""An attached model survives `torch.save(model)` / `torch.load(..., weights_only=False)` and `copy.deepcopy`.

`attach` replaces forwards with closures and adds hooks that pickle cannot store (`Can't pickle <function
Linear.forward>`). Each module it touched gets an instance-level `__getstate__` (pickle and deepcopy look it
up on the instance first) that hands out the module's state as it was before attach: its own forward (or
none) and no mpt hooks. The root's state gets instead a `Reattach` forward, which holds the plan and, on the
first call of the restored model, attaches it again (the same path `tuner.load` runs) and runs the call.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from torch import nn

_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_forward_hooks_always_called", "_forward_hooks_with_kwargs",
               "_forward_pre_hooks_with_kwargs")


class Reattach:
    """The forward of a restored model: attaches its plan (`attach(model)`, picklable) and runs the call."""

    def __init__(self, model: nn.Module, attach: Callable[[nn.Module], Any]) -> None:
        self.model = model
        self.attach = attach

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.attach(self.model)  # replaces model.forward with the plan's
        return self.model.forward(*args, **kwargs)


class _PlainState:
    """A module's `__getstate__`: its __dict__ without what attach added (see the module docstring)."""

    def __init__(self, module: nn.Module, before: Any, hook_ids: frozenset[int], root_forward: Any = None,
                 drop: Iterable[str] = ()) -> None:
        self.module, self.before, self.hook_ids = module, before, hook_ids
        self.root_forward, self.drop = root_forward, tuple(drop)

    def __call__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.module.__dict__.items() if k not in ("__getstate__", "forward", *self.drop)}
        for name in _HOOK_DICTS:
            hooks = state.get(name)
            if hooks is not None:
                state[name] = type(hooks)((k, v) for k, v in hooks.items() if k not in self.hook_ids)
        forward = self.root_forward if self.root_forward is not None else self.before
        if forward is not None:
            state["forward"] = forward
        return state


def make_portable(model: nn.Module, wrapped: Iterable[tuple[nn.Module, Any, Any]], handles: Iterable[Any],
                  attach: Callable[[nn.Module], Any], marker: str) -> None:
    """Give every module attach touched a `_PlainState`; the root's state carries a `Reattach` forward and
    not `marker` (the attachment). `wrapped`: (module, its forward before or a sentinel, a hook handle)."""
    ids = frozenset(h.id for h in handles) | frozenset(h.id for _, _, h in wrapped if h is not None)
    befores = {id(m): b for m, b, _ in wrapped}
    touched = {id(m): m for m, _, _ in wrapped}
    for module in model.modules():
        if any(k in ids for name in _HOOK_DICTS for k in getattr(module, name, {}) or {}):
            touched.setdefault(id(module), module)
    for key, module in touched.items():
        replaced = key in befores and (befores[key] is None or callable(befores[key]))  # else: forward untouched
        before = befores[key] if replaced else module.__dict__.get("forward")
        root = Reattach(model, attach) if module is model else None
        module.__dict__["__getstate__"] = _PlainState(module, before, ids, root, (marker,) if root else ())


def forget_portable(modules: Iterable[nn.Module]) -> None:
    """Undo `make_portable` (detach)."""
    for module in modules:
        module.__dict__.pop("__getstate__", None)

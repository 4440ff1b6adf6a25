"""Which module is running: a stack kept by global forward hooks.

Op calls are attributed to the innermost module on the stack. Paths are the
names `named_modules()` gives, relative to the root: the model passed to the
engine, or else the outermost module called while it is active ("" is the root).

A module that is not registered under the root (one a forward creates per call, as
`ACT2FN["silu"](x)` or `nn.SiLU()(x)` do, or one kept in a plain list) takes the path of
the module that called it: a plan can only name modules `named_modules()` has, and a
loaded plan runs such a module in its caller's region (`tuner.engine.native`), so its ops
are its caller's own ops.
"""
from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

OUTSIDE = "-"  # module path of op calls made outside any module


class ModuleTracker:
    """The stack of running modules, kept by forward hooks on every module (`install`) or by a caller
    that drives `enter_module`/`exit_module` itself (hooks on some modules only, a wrapped forward).

    `on_enter(module, path)` returns a token kept with the entry and handed to `on_exit(module, path,
    token)`; `on_root_enter()` runs when a module is entered on an empty stack (a new forward).
    """

    def __init__(self, root: nn.Module | None = None,
                 on_enter: Callable[[nn.Module, str], Any] | None = None,
                 on_exit: Callable[[nn.Module, str, Any], None] | None = None,
                 on_root_enter: Callable[[], None] | None = None) -> None:
        self._fixed_root = root
        self._names: weakref.WeakKeyDictionary[nn.Module, dict[int, str]] = weakref.WeakKeyDictionary()
        self._local = threading.local()
        self._handles: list[Any] = []
        self._users = 0  # `install`s not yet removed, all threads together
        self._lock = threading.Lock()
        self._on_enter = on_enter
        self._on_exit = on_exit
        self._on_root_enter = on_root_enter

    # The stack holds (module, path, token) where token is what on_enter returned.
    @property
    def stack(self) -> list[tuple[nn.Module, str, Any]]:
        st = getattr(self._local, "stack", None)
        if st is None:
            st = self._local.stack = []
        return st

    def current_path(self) -> str:
        """The innermost running module's path; OUTSIDE when none runs."""
        st = self.stack
        return st[-1][1] if st else OUTSIDE

    def _paths_for(self, root: nn.Module) -> dict[int, str]:
        names = self._names.get(root)
        if names is None:
            names = {}
            for name, mod in root.named_modules(remove_duplicate=False):
                names.setdefault(id(mod), name)
            self._names[root] = names
        return names

    def enter_module(self, module: nn.Module, args: Any = None) -> None:
        """Push `module` (a forward pre-hook's signature)."""
        st = self.stack
        if not st:
            root = self._fixed_root if self._fixed_root is not None else module
            self._local.root = root
            if self._on_root_enter is not None:
                self._on_root_enter()
        names = self._paths_for(self._local.root)
        path = names.get(id(module))
        if path is None:  # not registered under the root: its ops are its caller's (see the docstring)
            path = st[-1][1] if st else OUTSIDE
        token = self._on_enter(module, path) if self._on_enter is not None else None
        st.append((module, path, token))

    def exit_module(self, module: nn.Module, args: Any = None, output: Any = None) -> None:
        """Pop down to `module` (a forward hook's signature)."""
        st = self.stack
        # Pop down to this module (a forward that raised may have left entries behind).
        while st:
            mod, path, token = st.pop()
            if self._on_exit is not None:
                self._on_exit(mod, path, token)
            if mod is module:
                break

    def install(self) -> None:
        """Track every module's forward on this thread (global hooks) until the matching `remove`.

        Calls nest and threads count apart: the hooks are process-wide, so they stay until the last
        `remove` of any thread, and they follow only the threads between `install` and `remove` (a
        thread that calls a module while another is tracked leaves that one's stack alone, and its own).
        """
        self._local.active = getattr(self._local, "active", 0) + 1
        with self._lock:
            self._users += 1
            if not self._handles:
                self._handles = [
                    torch.nn.modules.module.register_module_forward_pre_hook(self._pre_hook),
                    torch.nn.modules.module.register_module_forward_hook(self._post_hook, always_call=True),
                ]

    def remove(self) -> None:
        """Undo one `install` of this thread (the hooks go with the last one)."""
        active = getattr(self._local, "active", 0)
        if active == 0:
            return
        self._local.active = active - 1
        with self._lock:
            self._users -= 1
            if self._users == 0:
                for h in self._handles:
                    h.remove()
                self._handles = []

    def _pre_hook(self, module: nn.Module, args: Any) -> None:
        if getattr(self._local, "active", 0):
            self.enter_module(module, args)

    def _post_hook(self, module: nn.Module, args: Any, output: Any) -> None:
        if getattr(self._local, "active", 0):
            self.exit_module(module, args, output)

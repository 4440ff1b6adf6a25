"""The precision engine: a TorchFunctionMode that casts op inputs by policy.

Why a TorchFunctionMode (see docs/design.md): it sees every top-level
torch / Tensor / functional call above autograd, so casts are recorded by
autograd and backward runs through them; it sees the Python-level names the
seed documents use (`__matmul__`, `truediv`, `iadd`, `cross_entropy`); and it
runs in the caller's context, so a module stack kept by forward hooks
attributes each call to the module that made it. TorchDispatchMode runs below
autograd (casts would be invisible to backward) and dispatcher autocast
kernels see ATen names only and cannot tell modules apart cheaply.
Python-written composites (F.multi_head_attention_forward, F.layer_norm...)
that no list names are run "transparently": their body runs with the mode
still on, so the builtin ops inside get their own rules, as torch.autocast's
ATen-level rules would give them.

When the policy is torch.autocast's own list for a device and nothing needs
per-call Python (no per-instance overrides, no recording, no verbose log),
`tuner.autocast` skips this engine and enters `torch.autocast` directly: same
results, no per-op cost. Per-module overrides still work there, via hooks.
"""
from __future__ import annotations

import threading
import types
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from tuner.core.dtypes import short_name
from tuner.core.torch_state import autocast_nesting
from tuner.engine import rnn_inputs
from tuner.engine.backends import BACKENDS, RNN_MODES, RnnBackend, rnn_aten_name
from tuner.engine.kernels import WATCHED, KernelWatch, kernel_dtype
from tuner.engine.regions import DeployedAutocast, deployed_autocast, plain_keys
from tuner.engine.tracker import OUTSIDE, ModuleTracker
from tuner.policy.modes import InplaceMode
from tuner.policy.opnames import (
    AUTOCAST_INSIDE,
    SKIP,
    UPDATES_BUFFERS,
    canonical_name,
    is_inplace,
    is_python_composite,
)
from tuner.policy.presets import Policy
from tuner.policy.rules import Rule

_F64 = torch.float64
_F32 = torch.float32
LOWER_DTYPES = frozenset({torch.bfloat16, torch.float16})  # what `Decision.lowered` means by a lower precision

class _ThreadState(threading.local):
    """Per-thread engine state: the disable_casts() depth, and the composites running transparently."""

    disabled = 0

    def __init__(self) -> None:
        self.transparent: set[Any] = set()


_STATE = _ThreadState()


class _EngineThread(threading.local):
    """One engine's per-forward state on one thread: call indices, and the module-override scopes entered.
    Threads running the same attached model each count their own forward."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}
        self.overrides: list[torch.dtype | None] = [None]
        self.nesting: list[int] = []  # torch.autocast's nesting depth at each entry of the engine (or region switch)
        self.deployed: list[DeployedAutocast | None] = []  # the state given the model's code, per entry (`as_deployed`)
        self.switches: list[Any] = []  # the torch.autocast blocks those entries opened (None: none)
        # id() of the exception the last call that raised raised, and that call's key: an id, not the exception,
        # which would hold its traceback's frames (and every tensor in them) for as long as the thread lives
        self.failed: tuple[int, InstanceKey] | None = None


def casts_disabled() -> bool:
    """Inside `disable_casts()` (on this thread)."""
    return _STATE.disabled > 0


@dataclass(frozen=True)
class Decision:
    """What the engine decided for one op call (for the verbose log, `mpt inspect` and the tuner).

    The call is `index`-th call of `op` made by the module at path `module` in
    this forward (`-` outside any module). Dtypes are torch.dtypes; the
    `*_name` properties give the text outputs print. `rule` says why, as data;
    `detail` completes its display text (the override's dtype, or `as matmul`
    when an alias matched the op lists); `casts` counts the inputs it cast.
    """

    module: str
    op: str
    index: int
    in_dtypes: tuple[torch.dtype, ...]  # of its floating-point inputs, as they arrived
    compute: torch.dtype | None  # the dtype it computed in; None when it had no floating-point input
    rule: Rule
    casts: int
    detail: str = ""
    # the dtype its kernel's matmuls computed in, when not `compute` (`tuner.engine.kernels`: torch's CPU attention
    # fallback widens bf16 q/k/v to FP32); None when they ran in `compute`, or were not watched
    kernel: torch.dtype | None = None

    @property
    def lowered(self) -> bool:
        """It was cast to (or came in) a lower precision (bf16 or fp16): keeping it FP32 changes its numbers."""
        return self.compute in LOWER_DTYPES

    @property
    def ran(self) -> torch.dtype | None:
        """The dtype its work computed in: its kernel's when that differs from the one it was cast to."""
        return self.kernel if self.kernel is not None else self.compute

    @property
    def ran_low(self) -> bool:
        """Its work computed in a lower precision: what a report's shares count and a plan claims."""
        return self.ran in LOWER_DTYPES

    @property
    def compute_name(self) -> str:
        """`compute` as printed: `bf16`, `fp32`, `-` when None."""
        return short_name(self.compute)

    @property
    def in_dtype_names(self) -> tuple[str, ...]:
        """`in_dtypes` as printed: (`fp32`, `bf16`)."""
        return tuple(short_name(d) for d in self.in_dtypes)

    @property
    def reason(self) -> str:
        """Display text: `lower list`, `in-place: not autocast`, `module override: fp32`."""
        return self.rule.describe(self.detail)

    @property
    def forced(self) -> bool:
        """The policy could not choose this call's precision (in-place, out=, explicit dtype=, nothing castable)."""
        return self.rule.forced


InstanceKey = tuple[str, str, int]  # (module path, op name, call index within that module)


@dataclass
class _FuncInfo:
    name: str
    skip: bool
    inplace: bool
    transparent: bool
    rule: Rule
    detail: str
    clone: Callable[..., Any] | None = None
    fast: bool = False  # passthrough with nothing to record: call straight through
    autocast_inside: bool = False  # lowered by running it under torch.autocast (opnames.AUTOCAST_INSIDE)
    input_only: bool = False  # updates buffers it is handed: only its input is cast (opnames.UPDATES_BUFFERS)


_CLONES: dict[Any, Callable[..., Any]] = {}


def _unchecked_clone(func: types.FunctionType) -> Callable[..., Any]:
    """A copy of a Python torch function whose own __torch_function__ check is off.

    Calling it with the mode active runs its body once (no re-dispatch of the
    function itself) while every builtin op inside still reaches the mode.
    """
    clone = _CLONES.get(func)
    if clone is None:
        glb = dict(func.__globals__)
        for name in ("has_torch_function", "has_torch_function_unary", "has_torch_function_variadic"):
            glb[name] = _false
        clone = types.FunctionType(func.__code__, glb, func.__name__, func.__defaults__, func.__closure__)
        clone.__kwdefaults__ = func.__kwdefaults__
        _CLONES[func] = clone
    return clone


def _false(*args: Any, **kwargs: Any) -> bool:
    return False


def _widest(dtypes: list[torch.dtype]) -> torch.dtype | None:
    if not dtypes:
        return None
    out = dtypes[0]
    for d in dtypes[1:]:
        if d != out:
            out = _F32  # fp32 with anything, or bf16 with fp16
    return out


class CastCache:
    """Lower-precision copies of parameters, reused while their version is unchanged.

    Keyed by (id, version, dtype, grad mode) and checked through a weakref, so an
    optimizer step (which bumps the version) or a freed tensor never hits a stale copy.
    """

    def __init__(self) -> None:
        self._store: dict[tuple[int, int, torch.dtype, bool], tuple[weakref.ref[Tensor], Tensor]] = {}

    def get(self, t: Tensor, dtype: torch.dtype) -> Tensor:
        key = (id(t), t._version, dtype, torch.is_grad_enabled())
        hit = self._store.get(key)
        if hit is not None and hit[0]() is t:
            return hit[1]
        out = t.to(dtype)
        if len(self._store) > 4096:
            self._store.clear()
        self._store[key] = (weakref.ref(t), out)
        return out

    def clear(self) -> None:
        self._store.clear()


class PrecisionEngine(TorchFunctionMode):
    """Applies a Policy (plus module and instance overrides) to every op call.

    `recorder(decision, func, args, kwargs, out, raw_args, raw_kwargs)` is called after each intercepted
    call (`args`/`kwargs` as the op ran, after casts; `raw_*` as they arrived). It normally returns None;
    a returned value of the output's kind (a Tensor for a tensor output, else the same type as `out`)
    replaces the call's output: the model gets it instead of `out` (the gradient ranking returns
    `out + a·δ`, a being a zero leaf, to make an op's output a point of the autograd graph). Any other
    return value (None, or what `list.append`/`dict.setdefault` give a one-line recorder) is ignored.
    `instance_overrides` is copied at construction; `engine.instance_overrides` may be changed between
    forward passes (rank_exact flips one entry per pass instead of building an engine per pass).
    `as_deployed=True` (mpt's measuring forwards) runs the model's code under the torch.autocast state
    `tuner.load` gives it, module by module (`tuner.engine.regions`), for a policy that runs as torch.autocast;
    `native_device` names that device instead of this machine's ("cuda": the CPU suite runs a CUDA tune's
    configuration). Without it the model's code sees torch.autocast off, as under `tuner.autocast(engine="python")`.
    `backend` is the configuration an RNN call is named and run by (`tuner.engine.backends`: cuDNN's on "cuda"),
    by default its input's device's.
    """

    def __init__(
        self,
        policy: Policy,
        dtype: torch.dtype,
        *,
        root: nn.Module | None = None,
        module_overrides: Mapping[str, torch.dtype] | None = None,
        instance_overrides: Mapping[InstanceKey, torch.dtype] | None = None,
        recorder: Callable[..., Any] | None = None,
        verbose: Callable[[Decision], None] | None = None,
        dry_run: bool = False,
        cache: CastCache | None = None,
        reset_counts_at_root: bool = True,
        as_deployed: bool = False,
        native_device: str | None = None,
        backend: RnnBackend | None = None,
    ) -> None:
        super().__init__()
        self.policy = policy
        self.dtype = dtype
        self.device = policy.device
        self.module_overrides = dict(module_overrides or {})
        self.instance_overrides = dict(instance_overrides or {})
        self.recorder = recorder
        self.verbose = verbose
        self.dry_run = dry_run
        self.cache = cache if cache is not None else CastCache()
        self._infos: dict[Any, _FuncInfo] = {}
        self._thread = _EngineThread()  # call indices and override scopes, per thread
        self._need_index = bool(self.instance_overrides) or recorder is not None or verbose is not None
        self._override_for_path: dict[str, torch.dtype | None] = {}
        self._users = 0  # threads (and nested entries) inside the engine: the cast copies stay until the last leaves
        self._users_lock = threading.Lock()
        self._root = root
        self.as_deployed = as_deployed
        self.native_device = native_device
        self.backend = backend  # the RNN kernels' configuration (`tuner.engine.backends`); None: each call's device's
        # the engine's own calls run with torch.autocast's dispatch keys excluded where it is on, as deployed (set on
        # entry: `_open_deployed`, from `as_deployed`, which a caller may also set on an engine it did not build)
        self._plain: torch._C.DispatchKeySet | None = None
        self.tracker = ModuleTracker(root, on_enter=self._on_module_enter, on_exit=self._on_module_exit,
                                     on_root_enter=self.reset_counts if reset_counts_at_root else None)

    # ----- module bookkeeping -------------------------------------------------
    def reset_counts(self) -> None:
        """Start call indices from 0 again (a new forward). The engine does it whenever the outermost
        module is entered, unless built with `reset_counts_at_root=False`: then its user calls this."""
        self._thread.counts.clear()

    def _module_override(self, path: str) -> torch.dtype | None:
        if path in self._override_for_path:
            return self._override_for_path[path]
        found = None
        for pattern, dtype in self.module_overrides.items():
            if path == pattern or fnmatchcase(path, pattern):
                found = dtype
                break
        self._override_for_path[path] = found
        return found

    def _on_module_enter(self, module: nn.Module, path: str) -> Any:
        if self.module_overrides:
            own = self._module_override(path)
            scopes = self._thread.overrides
            scopes.append(own if own is not None else scopes[-1])
        deployed = self._thread.deployed
        return self._switch_region(deployed[-1], path) if deployed and deployed[-1] is not None else None

    def _on_module_exit(self, module: nn.Module, path: str, token: Any) -> None:
        scopes = self._thread.overrides
        if self.module_overrides and len(scopes) > 1:
            scopes.pop()
        if token is not None:
            self._thread.nesting.pop()
            token.__exit__(None, None, None)

    def _switch_region(self, deployed: DeployedAutocast, path: str) -> torch.autocast | None:
        """The torch.autocast block that gives the module at `path` the state it runs its own code in once
        deployed, entered (None when it already has it, or runs inside a block the model opened itself, which
        decides there as it does deployed: `tuner.engine.native.install`)."""
        if deployed.uniform or self._model_region() is not None:
            return None
        on = deployed.on_at(path)
        if torch.is_autocast_enabled(deployed.device) == on:
            return None
        block = torch.autocast(deployed.device, dtype=deployed.dtype, enabled=on, cache_enabled=False)
        block.__enter__()
        self._thread.nesting.append(autocast_nesting())
        return block

    def _open_deployed(self) -> None:
        """On the outermost entry of a thread with `as_deployed`: torch.autocast turned on as `tuner.load` has
        it around the model (module regions switch it in `_switch_region`)."""
        deployed = None
        if self.as_deployed and not self._thread.deployed:
            deployed = deployed_autocast(self._root, self.policy, self.dtype, self.module_overrides,
                                         self.instance_overrides, self.native_device)
        block = None
        if deployed is not None:
            self._plain = plain_keys(deployed.device)
            block = torch.autocast(deployed.device, dtype=deployed.dtype, cache_enabled=False)
            block.__enter__()
        self._thread.deployed.append(deployed if deployed is not None else
                                     (self._thread.deployed[-1] if self._thread.deployed else None))
        self._thread.switches.append(block)

    # ----- context -------------------------------------------------------------
    def __enter__(self) -> PrecisionEngine:
        self._open_deployed()
        # module paths are only needed then (and where module regions switch torch.autocast: `_switch_region`)
        if self._need_index or self.module_overrides or self._thread.deployed[-1] is not None:
            self.tracker.install()  # per thread (tuner.engine.tracker)
        with self._users_lock:
            self._users += 1
        rnn_inputs.acquire()
        self._thread.nesting.append(autocast_nesting())
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            if self._thread.nesting:
                self._thread.nesting.pop()
            if self._thread.deployed:
                self._thread.deployed.pop()
                block = self._thread.switches.pop()
                if block is not None:
                    block.__exit__(None, None, None)
            self.tracker.remove()
            rnn_inputs.release()
            with self._users_lock:
                self._users -= 1
                if self._users == 0:  # another thread still in the engine keeps using the cast copies
                    self.cache.clear()

    # ----- per-call ------------------------------------------------------------
    def _info(self, func: Callable[..., Any]) -> _FuncInfo:
        info = self._infos.get(func)
        if info is not None:
            return info
        raw = getattr(func, "__name__", "")
        name = canonical_name(func)
        skip = raw in SKIP or name in SKIP or raw in ("__get__", "__set__")
        named = self.policy.names(name)
        transparent = not skip and not named and is_python_composite(func)
        rule, detail = self.policy.lookup(name)
        info = _FuncInfo(name=name, skip=skip, inplace=is_inplace(name), transparent=transparent,
                         rule=rule, detail=detail,
                         clone=_unchecked_clone(func) if transparent else None,  # type: ignore[arg-type]
                         autocast_inside=name in AUTOCAST_INSIDE and not self.policy.lists(name),
                         input_only=name in UPDATES_BUFFERS)
        info.fast = skip or (rule is Rule.PASSTHROUGH and not transparent and not self._need_index
                             and not self.module_overrides and name not in _ATEN_NAME and name not in RNN_MODES)
        self._infos[func] = info
        return info

    def __torch_function__(self, func: Callable[..., Any], types_: Any, args: tuple = (), kwargs: Any = None) -> Any:
        """One op call: decide its precision, cast its inputs, run it, report the Decision.

        The steps are methods, but the checks that skip them (the fast path, no recorder) stay
        here: this runs for every op of every forward.
        """
        if kwargs is None:
            kwargs = {}
        info = self._infos.get(func) or self._info(func)
        if info.fast or _STATE.disabled:
            return func(*args, **kwargs)
        if info.transparent and func not in _STATE.transparent:
            # (a composite that re-dispatches to itself is handled as one op: the second time it is in the set)
            return self._run_transparent(func, info, args, kwargs)

        refine = _ATEN_NAME.get(info.name)
        if info.name in RNN_MODES:
            name, rule, detail = self._aten_rule(info, rnn_aten_name(info.name, args, self.backend))
        elif refine is None:
            name, rule, detail = info.name, info.rule, info.detail
        else:
            name, rule, detail = self._aten_rule(info, refine(args, kwargs))
        path = self.tracker.current_path() if (self._need_index or self.module_overrides) else OUTSIDE
        index = 0
        if self._need_index:
            key = (path, name)
            counts = self._thread.counts
            index = counts.get(key, 0)
            counts[key] = index + 1
        block = self._model_region() if self._plain is not None or not rule.forced else None
        own = None if rule.forced else block
        if own is not None:
            target, rule, detail = None, own, ""
        else:
            target, rule, detail = self._target(info, rule, detail, (path, name, index), args, kwargs)

        casts = 0
        raw_args, raw_kwargs = args, kwargs
        watch = KernelWatch() if self.recorder is not None and name in WATCHED and not self.dry_run else None
        try:
            if (info.autocast_inside or name in _AUTOCAST_DECIDES) and target in LOWER_DTYPES and not self.dry_run:
                out = _under_autocast(func, target, args, kwargs, watch)
            else:
                if target is not None and not self.dry_run:
                    args, kwargs, casts = (self._cast_input(args, kwargs, target) if info.input_only
                                           else self._cast(args, kwargs, target))
                # as deployed, torch.autocast is on around the engine's calls: the engine decides them, not it
                out = _watched(func, args, kwargs, watch, self._plain if block is None else None)
        except Exception as exc:  # (free when nothing raises) which call it was: `failed_call`
            self._thread.failed = (id(exc), (path, name, index))
            raise

        if (self.recorder is not None or self.verbose is not None) and (
                isinstance(out, (Tensor, list, tuple)) or any(isinstance(a, Tensor) for a in args)):
            decision = self._decision((path, name, index), target, rule, detail, casts, args, kwargs,
                                      raw_args, raw_kwargs, out)
            if watch is not None and watch.dtypes:
                decision = _kernel_seen(decision, watch)
            out = self._report(decision, func, args, kwargs, out, raw_args, raw_kwargs)
        return out

    def failed_call(self, exc: BaseException) -> InstanceKey | None:
        """(module, op, index) of the call on this thread that raised `exc`, or an exception `exc` was raised
        from; None when no call the engine ran did. Needs call indices (an engine with a recorder or instance
        overrides): `tuner.engine.probe` names the op torch.autocast cannot run with it, as a plan names it."""
        failed = self._thread.failed
        seen: set[int] = set()
        current: BaseException | None = exc
        while failed is not None and current is not None and id(current) not in seen:
            if failed[0] == id(current):
                return failed[1] if self._need_index else None
            seen.add(id(current))
            current = current.__cause__ or current.__context__
        return None

    def _run_transparent(self, func: Callable[..., Any], info: _FuncInfo, args: tuple, kwargs: dict) -> Any:
        """Run a Python composite's body with the mode still on, so the builtin ops inside get their own rules."""
        active = _STATE.transparent
        active.add(func)
        TorchFunctionMode.__enter__(self)  # re-push only the mode, not the hooks
        try:
            return info.clone(*args, **kwargs)  # type: ignore[misc]
        finally:
            TorchFunctionMode.__exit__(self, None, None, None)
            active.discard(func)

    def _model_region(self) -> Rule | None:
        """Inside a `torch.autocast` block the model opened itself, the model decides, as torch.autocast runs it
        in every trial and in the deployed model: `Rule.MODEL_FP32` in a block with autocast off (every HF
        rotary embedding has one), `Rule.MODEL_AUTOCAST` in one with autocast on (torch.autocast casts);
        None elsewhere. Told apart from "no autocast at all" (the engine's own state) by torch.autocast's
        nesting depth: deeper than at the engine's entry."""
        entered = self._thread.nesting
        if not entered or autocast_nesting() <= entered[-1]:
            return None
        devices = (self.device,) if self.device is not None else ("cpu", "cuda")
        return Rule.MODEL_AUTOCAST if any(torch.is_autocast_enabled(d) for d in devices) else Rule.MODEL_FP32

    def _aten_rule(self, info: _FuncInfo, aten: str | None) -> tuple[str, Rule, str]:
        """(op name, rule, detail) for a call torch runs as the ATen op `aten` (`pad` as `reflection_pad2d`):
        the ATen op's when the policy names it (or, for `_RUNS_AS_ATEN` ops, whether or not it does), else the
        Python op's."""
        if aten is not None and (self.policy.names(aten) or info.name in _RUNS_AS_ATEN):
            rule, detail = self.policy.lookup(aten)
            return aten, rule, detail
        return info.name, info.rule, info.detail

    def _target(self, info: _FuncInfo, rule: Rule, detail: str, key: InstanceKey, args: tuple,
                kwargs: dict) -> tuple[torch.dtype | None, Rule, str]:
        """(dtype to cast the inputs to or None, rule, detail) for a call the op lists gave `rule`.

        What the call itself says wins (in-place, `out=`, `dtype=`), then the instance's and the
        module's overrides, then the lists; BANNED raises.
        """
        target: torch.dtype | None = None
        override = self._thread.overrides[-1] if self.module_overrides else None
        inst = self.instance_overrides.get(key) if self.instance_overrides else None
        if info.inplace or kwargs.get("out") is not None:
            skip_it = self.policy.inplace is InplaceMode.SKIP
            if info.inplace:
                rule = Rule.INPLACE if skip_it else Rule.INPLACE_FIRST_INPUT
            else:
                rule = Rule.OUT if skip_it else Rule.OUT_FIRST_INPUT
            detail = ""
        elif kwargs.get("dtype") is not None:
            rule, detail = Rule.EXPLICIT_DTYPE, ""
        elif inst is not None:
            target, rule, detail = inst, Rule.INSTANCE, short_name(inst)
        elif override is not None:
            target, rule, detail = override, Rule.MODULE, short_name(override)
        elif rule is Rule.LOWER:
            target = self.dtype
        elif rule in (Rule.FP32, Rule.UNLISTED_FP32):
            target = _F32
        elif rule is Rule.BANNED:
            raise RuntimeError(f"{info.name} is unsafe to autocast (banned by policy {self.policy.name!r}); "
                               f"use its *_with_logits form or run it under tuner.disable_casts()")
        if rule in _FROM_INPUTS:
            floats = self._float_dtypes(args, kwargs, first_only=rule is not Rule.PROMOTE)
            target = _widest(floats) if rule is Rule.PROMOTE else (floats[0] if floats else None)
        return target, rule, detail

    def _decision(self, key: InstanceKey, target: torch.dtype | None, rule: Rule, detail: str, casts: int,
                  args: tuple, kwargs: dict, raw_args: tuple, raw_kwargs: dict, out: Any = None) -> Decision:
        """The Decision for a call that ran: a call with nothing castable gets the rule that says why."""
        in_dtypes = tuple(self._float_dtypes(raw_args, raw_kwargs, first_only=False, all_=True))
        if casts == 0 and (not rule.forced or rule in _MODEL_RULES) and \
                not self._float_dtypes(raw_args, raw_kwargs, first_only=True):
            target, rule, detail = None, self._not_castable(raw_args, raw_kwargs), ""
        if rule is Rule.MODEL_AUTOCAST and isinstance(out, Tensor) and out.is_floating_point():
            target = out.dtype  # torch.autocast computed it in the dtype it handed out
        compute = target if target is not None else _ran_in(rule, kwargs, out,
                                                              self._float_dtypes(args, kwargs, first_only=False,
                                                                                 all_=True))
        return Decision(module=key[0], op=key[1], index=key[2], in_dtypes=in_dtypes, compute=compute,
                        rule=rule, casts=casts, detail=detail)

    def _report(self, decision: Decision, func: Callable[..., Any], args: tuple, kwargs: dict, out: Any,
                raw_args: tuple, raw_kwargs: dict) -> Any:
        """Hand `decision` to the verbose log and the recorder; the call's output (the recorder's, when it
        returns one of the output's kind: see the class doc)."""
        if self.verbose is not None:
            self.verbose(decision)
        if self.recorder is not None:
            if self._plain is not None:  # the recorder's own calls (a ranking's δ) run as the engine's do
                with torch._C._ExcludeDispatchKeyGuard(self._plain):
                    replaced = self.recorder(decision, func, args, kwargs, out, raw_args, raw_kwargs)
            else:
                replaced = self.recorder(decision, func, args, kwargs, out, raw_args, raw_kwargs)
            if replaced is not None and (isinstance(replaced, Tensor) if isinstance(out, Tensor)
                                         else type(replaced) is type(out)):
                return replaced
        return out

    def _not_castable(self, args: tuple, kwargs: dict) -> Rule:
        """Why a call with no castable input ran as it came: float64, another device, or no float at all."""
        floats = self._float_dtypes(args, kwargs, first_only=False, all_=True)
        if _F64 in floats:
            return Rule.FLOAT64
        return Rule.OTHER_DEVICE if floats else Rule.NO_FLOAT

    def _eligible(self, t: Tensor) -> bool:
        return t.is_floating_point() and t.dtype != _F64 and (self.device is None or t.device.type == self.device)

    def _float_dtypes(self, args: tuple, kwargs: dict, *, first_only: bool, all_: bool = False) -> list[torch.dtype]:
        found: list[torch.dtype] = []
        for a in (*args, *(v for k, v in kwargs.items() if k != "out")):
            items = a if isinstance(a, (list, tuple)) else (a,)
            for t in items:
                if isinstance(t, Tensor) and (t.is_floating_point() if all_ else self._eligible(t)):
                    found.append(t.dtype)
                    if first_only:
                        return found
        return found

    def _cast_one(self, t: Any, target: torch.dtype) -> tuple[Any, int]:
        if isinstance(t, Tensor) and t.dtype != target and self._eligible(t):
            if t.is_leaf and t.requires_grad and torch.is_grad_enabled():  # (inference: no second copy kept)
                return self.cache.get(t, target), 1
            return t.to(target), 1
        return t, 0

    def _cast_input(self, args: tuple, kwargs: dict, target: torch.dtype) -> tuple[tuple, dict, int]:
        """A buffer-updating op's casts (opnames.UPDATES_BUFFERS): its input to `target`; each other tensor only
        where the kernel would refuse it (a lower dtype other than `target`), so FP32 weights and running
        statistics go in as themselves and the op updates the model's own buffers."""
        total = 0
        cast_args = list(args)
        for n, a in enumerate(args):
            if n == 0 or (isinstance(a, Tensor) and a.dtype in LOWER_DTYPES and a.dtype != target):
                cast_args[n], casts = self._cast_one(a, target)
                total += casts
        if "input" in kwargs:
            kwargs = dict(kwargs)
            kwargs["input"], casts = self._cast_one(kwargs["input"], target)
            total += casts
        return tuple(cast_args), kwargs, total

    def _cast(self, args: tuple, kwargs: dict, target: torch.dtype) -> tuple[tuple, dict, int]:
        total = 0
        new_args = []
        for a in args:
            if isinstance(a, (list, tuple)) and a and isinstance(a[0], Tensor):
                items = []
                for t in a:
                    t2, n = self._cast_one(t, target)
                    items.append(t2)
                    total += n
                new_args.append(type(a)(items) if isinstance(a, tuple) else items)
            else:
                a2, n = self._cast_one(a, target)
                new_args.append(a2)
                total += n
        if kwargs:
            new_kwargs = {}
            for k, v in kwargs.items():
                if k == "out":
                    new_kwargs[k] = v
                    continue
                v2, n = self._cast_one(v, target)
                new_kwargs[k] = v2
                total += n
            kwargs = new_kwargs
        return tuple(new_args), kwargs, total


def _ran_in(rule: Rule, kwargs: dict, out: Any, floats: list[torch.dtype]) -> torch.dtype | None:
    """The dtype a call the engine did not cast computed in: `dtype=` when it names a floating dtype, torch's
    type promotion when the output took the dtype of another of its inputs (`add(bf16, fp32)` ran in
    fp32), else its first floating-point input's. An in-place or `out=` call writes in the dtype it was
    handed, so its first input's dtype is kept."""
    asked = kwargs.get("dtype") if rule is Rule.EXPLICIT_DTYPE else None
    if isinstance(asked, torch.dtype) and asked.is_floating_point:
        return asked
    if not floats:
        return None
    items = out if isinstance(out, (list, tuple)) else (out,)
    first = next((o for o in items if isinstance(o, Tensor)), None)
    if not rule.mutates and first is not None and first.dtype != floats[0] and first.dtype in floats:
        return first.dtype
    return floats[0]


def _watched(func: Callable[..., Any], args: tuple, kwargs: dict, watch: KernelWatch | None,
             plain: torch._C.DispatchKeySet | None = None) -> Any:
    """The call, under `watch` when there is one (a recorded matmul-like call: `tuner.engine.kernels`), with
    the `plain` dispatch keys (torch.autocast's: `tuner.engine.regions.plain_keys`) excluded when given."""
    if plain is not None:
        with torch._C._ExcludeDispatchKeyGuard(plain):
            return _watched(func, args, kwargs, watch)
    if watch is None:
        return func(*args, **kwargs)
    with watch:
        return func(*args, **kwargs)


def _kernel_seen(decision: Decision, watch: KernelWatch) -> Decision:
    """`decision` with the dtype its kernels computed in, when that is not the one it was cast to."""
    kernel = kernel_dtype(watch.dtypes, decision.compute)
    return decision if kernel is None else replace(decision, kernel=kernel)


def _under_autocast(func: Callable[..., Any], dtype: torch.dtype, args: tuple, kwargs: dict,
                    watch: KernelWatch | None = None) -> Any:
    """An AUTOCAST_INSIDE composite (nn.GRUCell's `gru_cell`...) lowered as torch.autocast lowers it: the call run
    under torch.autocast on its inputs' device, which casts only the matmuls inside it (opnames.AUTOCAST_INSIDE),
    so its numbers and output dtype are those the deployed model computes. No weight cache: one call."""
    first = next((t for t in (*args, *kwargs.values()) if isinstance(t, Tensor)), None)
    device = first.device.type if first is not None else "cpu"
    with torch.autocast(device, dtype=dtype, cache_enabled=False):
        return _watched(func, args, kwargs, watch)


_MODEL_RULES = frozenset({Rule.MODEL_FP32, Rule.MODEL_AUTOCAST})  # the model's own torch.autocast regions

# Rules whose target comes from the call's own inputs (widest, or the first one).
_FROM_INPUTS = frozenset({Rule.PROMOTE, Rule.FIRST_INPUT, Rule.INPLACE_FIRST_INPUT, Rule.OUT_FIRST_INPUT})


def _pad_aten_name(args: tuple, kwargs: dict) -> str | None:
    """F.pad(mode="reflect"|"replicate") runs reflection_pad{1,2,3}d/replication_pad{1,2,3}d in ATen."""
    mode = kwargs.get("mode", args[2] if len(args) > 2 else "constant")
    pad = kwargs.get("pad", args[1] if len(args) > 1 else ())
    family = {"reflect": "reflection_pad", "replicate": "replication_pad"}.get(mode)
    return f"{family}{len(pad) // 2}d" if family is not None and pad else None


def _dot_aten_name(args: tuple, kwargs: dict) -> str | None:
    """torch.inner / torch.tensordot of two 1-d tensors, contracted over their one dimension, run as ATen's `dot`
    (their other shapes as mm/bmm, which the lists' Python-level entries for them describe): on CPU torch.autocast
    does not lower `dot`, so such a call computes in FP32 (issue 34)."""
    tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, Tensor)][:2]
    if len(tensors) < 2 or tensors[0].dim() != 1 or tensors[1].dim() != 1:
        return None
    dims = kwargs.get("dims", args[2] if len(args) > 2 else 1)
    contracted = dims if isinstance(dims, int) else len(dims[0]) if isinstance(dims, (list, tuple)) and dims and \
        isinstance(dims[0], (list, tuple)) else 1
    return "dot" if contracted == 1 else None


# Python-level ops that torch runs as a differently named ATen op, depending on the call's arguments:
# when the policy lists that ATen op, its rule decides (torch.autocast sees only the ATen name). The RNN ops
# (`backends.RNN_MODES`) too, by the device's configuration (`tuner.engine.backends`).
_ATEN_NAME: dict[str, Callable[[tuple, dict], str | None]] = {"pad": _pad_aten_name, "inner": _dot_aten_name,
                                                              "tensordot": _dot_aten_name}
# ... and those whose listed rule describes their other ATen form only (torch-cpu lists `inner` and `tensordot` as
# lower for what they run as mm): the ATen op's rule decides, its list's or the unlisted one.
_RUNS_AS_ATEN = frozenset({"inner", "tensordot"})
# ATen ops whose torch.autocast kernel picks its dtype itself (cuDNN's RNN: float16): lowered under torch.autocast
_AUTOCAST_DECIDES = frozenset(b.aten for b in BACKENDS.values() if b.autocast_decides)


class disable_casts:
    """Context in which nothing is cast (HMP's `hmp.disable_casts()`): wrap an optimizer step.

    Also turns torch.autocast off inside, for the fast path that delegates to it.
    Works as a decorator too; contexts nest, and apply to the current thread only.
    """

    def __enter__(self) -> disable_casts:
        _STATE.disabled += 1
        self._autocasts = [torch.autocast(dev, enabled=False) for dev in ("cpu", "cuda")
                           if dev == "cpu" or torch.cuda.is_available()]
        for ac in self._autocasts:
            ac.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        for ac in reversed(self._autocasts):
            ac.__exit__(*exc)
        _STATE.disabled -= 1

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        import functools

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with disable_casts():
                return fn(*args, **kwargs)

        return wrapper

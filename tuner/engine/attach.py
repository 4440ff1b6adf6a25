"""The public ways to turn a policy on: `with tuner.autocast(...)`, `tuner.convert()`, `tuner.attach()`."""
from __future__ import annotations

import contextlib
import functools
import logging
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tuner.core.dtypes import parse_dtype, short_name
from tuner.core.errors import ConfigError
from tuner.engine import grouped, native
from tuner.engine.function_mode import Decision, PrecisionEngine
from tuner.engine.kind import EngineKind
from tuner.engine.portable import Reattach, forget_portable, make_portable
from tuner.engine.regions import native_device, scoped_modules
from tuner.policy.modes import NativeDevice
from tuner.policy.plan import Plan
from tuner.policy.presets import Policy, custom_policy, load_preset

log = logging.getLogger("tuner")

PolicyLike = str | Path | Plan | Policy


# torch.autocast's `device_type`, as `tuner.autocast("cpu", torch.bfloat16)` gives it: the preset that is its lists
DEVICE_PRESETS = {"cpu": "torch-cpu", "cuda": "torch-cuda"}


def device_preset(policy: PolicyLike | torch.device) -> PolicyLike:
    """`"cpu"`/`"cuda"` (or a torch.device) -> the torch-cpu/torch-cuda preset; anything else as given."""
    if isinstance(policy, torch.device):
        policy = policy.type
    if isinstance(policy, str) and policy in DEVICE_PRESETS:
        return DEVICE_PRESETS[policy]
    return policy


def as_plan(policy: PolicyLike) -> PolicyLike:
    """A plan file or folder read into a Plan; anything else as given."""
    if isinstance(policy, (str, Path)) and (str(policy).endswith((".yaml", ".yml")) or Path(policy).is_dir()):
        return Plan.load(policy)
    return policy


def check_plan_fits(policy: PolicyLike, model: nn.Module | None, *, folder: str | Path | None = None) -> None:
    """PlanMismatchError when `policy` is a plan recorded for another architecture than `model` (`folder`: the
    plan's, which its recorded paths are relative to).

    Plans without `model:` (older or hand-written ones) are accepted as they are.
    """
    if model is not None and isinstance(policy, Plan) and policy.model is not None:
        policy.model.check_structure(model, folder=folder)


def resolve(policy: PolicyLike, dtype: str | torch.dtype | None = None,
            modules: Mapping[str, str | torch.dtype] | None = None) -> tuple[Policy, torch.dtype, dict, dict]:
    """(policy, dtype, module overrides, instance overrides) from a preset name, plan file or object."""
    instances: dict = {}
    mods: dict = {}
    policy = as_plan(policy)
    if isinstance(policy, Plan):
        pol = policy.policy()
        default_dtype = policy.torch_dtype
        mods = policy.module_overrides()
        instances = policy.instance_overrides()
    elif isinstance(policy, Policy):
        pol, default_dtype = policy, parse_dtype(policy.dtype)
    elif isinstance(policy, str):
        pol = load_preset(policy)
        default_dtype = parse_dtype(pol.dtype)
    else:
        raise ConfigError(f"policy must be a preset name, a plan file or a Plan/Policy, found {type(policy).__name__}")
    try:
        lower = parse_dtype(dtype, lower_only=True) if dtype is not None else default_dtype
        for k, v in (modules or {}).items():
            mods[k] = parse_dtype(v)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return pol, lower, mods, instances


def check_module_patterns(model: nn.Module, patterns: Iterable[str]) -> None:
    """ConfigError naming every module path or glob that matches no module of `model` (a typo would
    otherwise override nothing, silently)."""
    paths = [p for p, _ in model.named_modules()]
    unmatched = [q for q in patterns if not any(p == q or fnmatchcase(p, q) for p in paths)]
    if unmatched:
        top = [p for p in paths if p and "." not in p]
        listing = ", ".join(top[:12]) + (", ..." if len(top) > 12 else "") if top else "none"
        raise ConfigError([f"module pattern {q!r} matches no module of the model (its top-level modules: "
                           f"{listing})" for q in unmatched])


class _VerboseHandler(logging.StreamHandler):
    """The stderr handler `verbose=True` adds to the `tuner` logger when logging is not set up.

    It writes to whatever `sys.stderr` is when a record is emitted (redirections and pytest's capture included).
    """

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def _show_verbose_log() -> None:
    """Make `verbose=True` visible without logging setup: with no handler anywhere on the `tuner` logger's
    path (the root logger included), add one that writes `tuner: MESSAGE` lines to stderr at INFO. A
    configured logging setup (any handler) is left alone: the decisions go where it sends INFO records."""
    if log.hasHandlers():
        if any(isinstance(h, _VerboseHandler) for h in log.handlers) and log.getEffectiveLevel() > logging.INFO:
            log.setLevel(logging.INFO)
        return
    handler = _VerboseHandler()
    handler.setFormatter(logging.Formatter("tuner: %(message)s"))
    log.addHandler(handler)
    if log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)


def _log_decision(decision: Decision) -> None:
    log.info("%s  %s#%d  %s -> %s  (%s)", decision.module or "(root)", decision.op, decision.index,
             ",".join(decision.in_dtype_names) or "-", decision.compute_name, decision.reason)


class _Entered(threading.local):
    """The torch.autocast objects one `tuner.autocast` on torch's own path has entered on this thread, innermost
    last. torch.autocast keeps the state its exit puts back on the object: one object entered by two threads
    (a decorated function served from a thread pool) would give the first thread to exit the state of the
    last to enter. So every entry makes its own, kept per thread."""

    def __init__(self) -> None:
        self.stack: list[torch.autocast] = []


class autocast:
    """Run ops in a lower precision by policy: `with tuner.autocast("hmp", dtype="bf16"): model(x)`.

    `policy` is a preset name, a plan file (or output folder), a Plan or a Policy; torch.autocast's
    `device_type` ("cpu", "cuda" or a torch.device) means its own lists, the torch-cpu/torch-cuda preset:
    `tuner.autocast("cpu", torch.bfloat16)` is torch.autocast's positional form.
    `modules` maps a module path or glob to a dtype and wins over the op lists; with `model`, a
    pattern that matches none of its modules is a ConfigError naming it.
    `verbose=True` logs every decision to the `tuner` logger at INFO; when logging is not set up (no
    handler), it adds a stderr handler so the lines show (`tuner: MODULE  OP#N  IN -> COMPUTE  (RULE)`).
    A callable gets each Decision instead.
    `engine` (an EngineKind or its value): `"auto"` uses torch.autocast itself when the policy is
    its own list and nothing needs per-call Python; `"python"` always uses mpt's engine; `"torch"`
    torch.autocast or a ConfigError. `dtype` is the lower dtype (the policy's when None); `model`
    gives module paths their root and lets a plan be checked against it; `recorder` is the engine's
    (see PrecisionEngine); `lower_list`/`fp32_list` replace the op lists from files; `dry_run`
    records decisions without casting. Also works as a decorator.
    Raises ConfigError for a bad policy, dtype, list or engine, and PlanMismatchError for a plan
    that records another model's structure than `model`.
    """

    def __init__(self, policy: PolicyLike | torch.device = "torch-cpu", dtype: str | torch.dtype | None = None, *,
                 model: nn.Module | None = None, modules: Mapping[str, str | torch.dtype] | None = None,
                 verbose: bool | Callable[[Decision], None] = False,
                 recorder: Callable[..., None] | None = None, engine: str | EngineKind = EngineKind.AUTO,
                 lower_list: str | Path | None = None, fp32_list: str | Path | None = None,
                 dry_run: bool = False) -> None:
        policy = as_plan(device_preset(policy))
        check_plan_fits(policy, model)
        if model is not None and modules:
            check_module_patterns(model, modules)
        pol, lower, mods, instances = resolve(policy, dtype, modules)
        if lower_list or fp32_list:
            pol = custom_policy(pol, lower_file=lower_list, fp32_file=fp32_list)
        kind = EngineKind.parse(engine)
        self.policy, self.dtype = pol, lower
        verbose_fn = _log_decision if verbose is True else (verbose or None)
        if verbose is True:
            _show_verbose_log()
        plain = not mods and not instances and recorder is None and verbose_fn is None and not dry_run
        self.native = kind is EngineKind.TORCH or (kind is EngineKind.AUTO and plain and native_device(pol) is not None)
        if self.native:
            if not plain or pol.native is None:
                raise ConfigError("engine='torch' needs a torch-* preset and no overrides, recorder or verbose")
            self._native = (pol.native.value, lower)
            self._entered = _Entered()
            self._ctx: Any = None
        else:
            self._ctx = PrecisionEngine(pol, lower, root=model, module_overrides=mods,
                                        instance_overrides=instances, recorder=recorder, verbose=verbose_fn,
                                        dry_run=dry_run)

    @property
    def engine(self) -> PrecisionEngine | None:
        """mpt's engine this context runs; None when it runs torch.autocast itself."""
        return None if self.native else self._ctx

    def __enter__(self) -> autocast:
        if self.native:  # a torch.autocast of this entry's own: it keeps the state to put back on exit
            # No weight cache where a block can train: torch.autocast keeps its cast of each parameter until the
            # outermost block exits, so a block opened around a training loop would train on the first step's
            # weights (issue 41). A block entered under no_grad (inference) keeps it, as before: without it a CPU
            # TransformerEncoder forward there measured 2.5x slower (bf16, torch 2.13); a training step did not.
            ctx = torch.autocast(self._native[0], dtype=self._native[1], cache_enabled=not torch.is_grad_enabled())
            ctx.__enter__()
            self._entered.stack.append(ctx)
            return self
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.native:
            self._entered.stack.pop().__exit__(*exc)
            return
        self._ctx.__exit__(*exc)

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return wrapper


# ----- HMP-style process-wide switch ------------------------------------------------
_GLOBAL: list[autocast] = []


def convert(opt_level: str | None = None, lower_list_path: str | Path | None = "",
            fp32_list_path: str | Path | None = "", verbose: bool | Callable[[Decision], None] = False, *,
            dtype: str | torch.dtype = "bf16", preset: str | None = None,
            bf16_file_path: str | Path | None = None, fp32_file_path: str | Path | None = None) -> autocast:
    """Turn mixed precision on for the whole script, like `hmp.convert()`.

    opt_level None uses the `hmp` preset (Habana HMP's default lists); "O1"/"O2" use
    `hmp-o1`/`hmp-o2`; `preset` picks any other. `lower_list_path` and
    `fp32_list_path` replace the lists; `bf16_file_path`/`fp32_file_path` are the same under HMP's own
    names, so `hmp.convert(bf16_file_path=..., fp32_file_path=...)` runs here with `hmp` replaced by `tuner`
    (the files `mpt tune` writes as hmp_ops_bf16.txt/hmp_ops_fp32.txt, or any in that format; an fp16 plan's
    hmp_ops_fp16.txt goes with `dtype="fp16"`).
    Wrap optimizer steps in `tuner.disable_casts()`. Undo with `tuner.revert()`.
    A second `convert()` replaces the first. Returns the autocast context that is on.
    Raises ConfigError for an unknown opt_level, preset, dtype or op-list file, or a list given twice.
    """
    both = [f"{hmp} and {ours}" for hmp, ours, a, b in (("bf16_file_path", "lower_list_path", bf16_file_path,
                                                         lower_list_path),
                                                        ("fp32_file_path", "fp32_list_path", fp32_file_path,
                                                         fp32_list_path)) if a and b]
    if both:
        raise ConfigError(f"convert(): {', '.join(both)} name the same list; give one")
    lower_list_path = bf16_file_path or lower_list_path
    fp32_list_path = fp32_file_path or fp32_list_path
    if preset is None:
        levels = {None: "hmp", "O1": "hmp-o1", "O2": "hmp-o2"}
        key = opt_level.upper() if isinstance(opt_level, str) else opt_level
        if key not in levels:
            raise ConfigError(f"opt_level: expected O1 or O2, found {opt_level!r}")
        preset = levels[key]
    revert()
    ctx = autocast(preset, dtype, verbose=verbose, engine=EngineKind.PYTHON,
                   lower_list=lower_list_path or None, fp32_list=fp32_list_path or None)
    ctx.__enter__()
    _GLOBAL.append(ctx)
    return ctx


def revert() -> None:
    """Undo `tuner.convert()` (nothing when it is not on)."""
    while _GLOBAL:
        _GLOBAL.pop().__exit__(None, None, None)


# ----- plans that travel with the model ------------------------------------------------
_ATTACHED = "_mpt_precision"


def attach(model: nn.Module, policy: PolicyLike, dtype: str | torch.dtype | None = None, *,
           engine: str | EngineKind = EngineKind.AUTO) -> nn.Module:
    """Make `model(...)` run under the policy with no `with` block (what `tuner.load` returns).

    Ops inside the model's forward follow the plan; code around the call
    (the user's metric, the loss) runs as usual. A plan tuned for training
    (`for_training`) hands the forward's bf16/fp16 float outputs back in FP32, so
    the loss computed on them runs FP32, as every trial ran it (`_training_outputs`).
    `tuner.detach(model)` undoes it
    and `tuner.attached(model)` says how the plan runs (`native.Execution`).

    With a torch-* preset and engine="auto" the plan runs natively: under
    torch.autocast, with its FP32 overrides as module regions (`tuner.engine.native`),
    so `torch.compile` and `torch.export` see plain torch code. Plans regions
    cannot express run torch.autocast with mpt's engine inside the modules that
    need it (scoped); other presets or engine="python" use mpt's engine throughout.
    Raises PlanMismatchError when the plan was made for another model.
    """
    policy = as_plan(policy)
    check_plan_fits(policy, model)
    detach(model)
    pol, lower, mods, instances = resolve(policy, dtype)
    kind = EngineKind.parse(engine)
    device = native_device(pol)
    reason = "engine='python'" if kind is EngineKind.PYTHON else \
        f"preset {pol.name} is not torch.autocast's own lists" if device is None else ""
    if kind is EngineKind.TORCH and device is None:
        raise ConfigError("engine='torch' needs a torch-* preset on its own device")
    if device is not None and not reason:
        realized = native.realize(model, device.value, lower, mods, instances)
        if isinstance(realized, native.Execution):
            setattr(model, _ATTACHED, _Attachment(realized, native.install(model, realized)))
            _training_outputs(model, policy)
            return _portable(model, policy, dtype, kind)
        reason = realized
        if kind is EngineKind.TORCH:
            raise ConfigError(f"engine='torch' cannot run this plan: {reason}")
        forward, scoped = _scoped_forward(model, pol, device, lower, mods, instances)
        execution = native.Execution(native.ExecutionPath.SCOPED, device.value, lower, python_modules=scoped,
                                     reason=reason)
    else:
        forward = _full_forward(model, PrecisionEngine(pol, lower, root=model, module_overrides=mods,
                                                       instance_overrides=instances))
        execution = native.Execution(native.ExecutionPath.PYTHON, reason=reason)
    before = model.__dict__.get("forward")
    model.forward = torch.compiler.disable(forward)  # mpt's engine is Python per op: never traced  # type: ignore[method-assign]
    wrapped: native.Wrapped = [(model, before, None)]
    if execution.path is native.ExecutionPath.SCOPED and execution.device is not None:  # torch.autocast outside
        grouped.wrap_owners(model, execution.device, wrapped)  # the engine's modules
    setattr(model, _ATTACHED, _Attachment(execution, wrapped, getattr(forward, "_mpt_handles", [])))
    _training_outputs(model, policy)
    return _portable(model, policy, dtype, kind)


def _training_outputs(model: nn.Module, policy: PolicyLike) -> None:
    """A training plan's attached forward returns its float outputs in FP32 (`native.fp32_outputs`).

    What one training step under a plan runs, on every path: the model's forward under the plan, then the loss
    and everything else outside it in FP32. torch.autocast around forward and loss gets that from its FP32 list
    (the losses are in every preset's); outside any block nothing would: a lowered last layer's bf16 logits
    gave a bf16 loss, so the trials (which attach as `tuner.load` does) trained another model than a loop with
    the plan around forward and loss, or the op-type lists (issue 45). The root's forward is wrapped, not
    hooked: `detach` puts back the forward attach found, and a model restored by pickle, which attaches its plan
    inside its first call, returns that call's outputs in FP32 too."""
    if isinstance(policy, Plan) and policy.for_training:
        model.forward = native.fp32_outputs(model.forward)


def _reattach(policy: PolicyLike, dtype: str | torch.dtype | None, engine: EngineKind, model: nn.Module) -> None:
    attach(model, policy, dtype, engine=engine)


def _portable(model: nn.Module, policy: PolicyLike, dtype: str | torch.dtype | None, kind: EngineKind) -> nn.Module:
    """`model` picklable with its plan (tuner.engine.portable): restored, it attaches the plan again."""
    state = model.__dict__[_ATTACHED]
    state.plan = AttachedPlan(policy, dtype, kind)
    make_portable(model, state.wrapped, state.handles, functools.partial(_reattach, policy, dtype, kind), _ATTACHED)
    return model


@dataclass
class _Attachment:
    execution: native.Execution
    wrapped: native.Wrapped  # modules whose forward was replaced, and what they had before
    handles: list[Any] = field(default_factory=list)  # hooks of the scoped path
    plan: AttachedPlan | None = None  # what was attached, to attach it again


@dataclass(frozen=True)
class AttachedPlan:
    """The arguments `attach` was called with (its policy read from file once: `as_plan`)."""

    policy: PolicyLike
    dtype: str | torch.dtype | None
    engine: EngineKind


@contextlib.contextmanager
def suspended(model: nn.Module) -> Iterator[AttachedPlan | None]:
    """The plan attached to `model` (None: none), detached until the block ends and then attached again:
    what `inspect_model` runs its own passes on."""
    attached(model)  # a model restored by pickle attaches its plan first
    state = model.__dict__.get(_ATTACHED)
    held = state.plan if isinstance(state, _Attachment) else None
    if held is None:
        yield None
        return
    detach(model)
    try:
        yield held
    finally:
        attach(model, held.policy, held.dtype, engine=held.engine)


def _full_forward(model: nn.Module, eng: PrecisionEngine) -> Callable[..., Any]:
    """The model's forward under `eng`, the model itself on the engine's module stack."""
    original = model.forward

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        with _engine_on(eng, model, args):
            return original(*args, **kwargs)

    return forward


@contextlib.contextmanager
def _engine_on(eng: PrecisionEngine, model: nn.Module, args: tuple) -> Iterator[None]:
    """`eng` active with `model` on its module stack: the root's own calls are attributed to the root."""
    with eng:
        eng.tracker.enter_module(model, args)
        try:
            yield
        finally:
            eng.tracker.exit_module(model, args, None)


class _ScopedThread(threading.local):
    """The scoped path's state on one thread: attached forwards running, and the regions its modules entered."""

    def __init__(self) -> None:
        self.depth = 0
        self.regions: dict[int, torch.autocast] = {}  # id(module) -> the autocast-off region it runs in


def _scoped_forward(model: nn.Module, pol: Policy, device: NativeDevice, lower: torch.dtype, mods: dict,
                    instances: dict) -> tuple[Callable[..., Any], tuple[str, ...]]:
    """torch.autocast for the model, mpt's engine inside the modules that own overrides (and their paths)."""
    # Each scoped module enters the engine on an empty module stack: call indices are reset once per
    # model call (below), not at each of those entries.
    eng = PrecisionEngine(pol, lower, root=model, module_overrides=mods, instance_overrides=instances,
                          reset_counts_at_root=False)
    names = dict(model.named_modules())
    scoped = scoped_modules(model, mods, instances)  # the outermost: the engine follows their children itself
    local = _ScopedThread()  # each thread's own depth and regions: threads may run the model at once

    def pre(module: nn.Module, args: Any) -> None:
        if local.depth == 0:
            return  # called outside the attached forward
        region = local.regions[id(module)] = torch.autocast(device.value, enabled=False)
        region.__enter__()
        eng.__enter__()
        eng.tracker.enter_module(module, args)

    def post(module: nn.Module, args: Any, output: Any) -> None:
        region = local.regions.pop(id(module), None)
        if region is None:
            return
        eng.tracker.exit_module(module, args, output)
        eng.__exit__(None, None, None)
        region.__exit__(None, None, None)

    handles = []
    for path in scoped:
        if path == "":
            continue
        mod = names[path]
        handles.append(mod.register_forward_pre_hook(pre))
        handles.append(mod.register_forward_hook(post, always_call=True))
    original = model.forward
    root_scoped = "" in scoped

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        eng.reset_counts()
        local.depth += 1
        try:
            if root_scoped:
                with _engine_on(eng, model, args):
                    return original(*args, **kwargs)
            with native.low_autocast(device.value, lower):
                return original(*args, **kwargs)
        finally:
            local.depth -= 1

    forward._mpt_handles = handles  # type: ignore[attr-defined]
    return forward, tuple(sorted(scoped))


def detach(model: nn.Module) -> nn.Module:
    """Undo `attach`: the model's own forwards again (and no hooks). A model with nothing attached is
    left as it is. Returns `model`."""
    state = model.__dict__.pop(_ATTACHED, None)
    if isinstance(model.__dict__.get("forward"), Reattach):  # restored by pickle, not attached again yet
        del model.__dict__["forward"]
    if isinstance(state, _Attachment):
        forget_portable(model.modules())
        native.uninstall(state.wrapped)
        for handle in state.handles:
            handle.remove()
    return model


def attached(model: nn.Module) -> native.Execution | None:
    """How the plan attached to `model` runs (native, scoped or python), or None when none is attached."""
    pending = model.__dict__.get("forward")
    if isinstance(pending, Reattach):  # restored by pickle: attach its plan now, as its first call would
        pending.attach(model)
    state = getattr(model, _ATTACHED, None)
    return state.execution if isinstance(state, _Attachment) else None


__all__ = ["autocast", "convert", "revert", "attach", "detach", "attached", "suspended", "AttachedPlan",
           "resolve", "as_plan", "check_plan_fits",
           "short_name"]

"""What a plan's deployed model runs, seen where the kernels are chosen: the ATen level.

`observe(model, plan, inputs)` attaches `plan` to the FP32 model the way `tuner.load` and every trial do
(`tuner.engine.attach`), runs `inputs` once under a `TorchDispatchMode` and records:

- every use of every parameter: a parameter whose every use is a cast to one of the plan's 16-bit dtypes
  (its lower dtype, or its fallback's: `Plan.fallback`) is `lowered`: stored in that dtype (FP32 where two
  dtypes read it), the loaded model computes the same bits as the FP32 model the
  trials ran (the cast is then a no-op), whatever the container structure, parametrizations or
  fused kernels (a fused kernel that reads a weight directly is a use in FP32);
- the dtypes every matmul/conv-like ATen op ran in, per module path (`ModuleTracker`'s paths:
  a module created inside a forward counts as its caller), which `gemm_mismatches` compares with
  what the plan claims;
- the FLOPs of those ops by the dtype each computed in (its output's; `tuner.measure.flops.aten_flops`): the
  share of them in bf16/fp16 is the share the deployed model runs low, which `verify` compares with the
  report's (issue 40: a kernel that widens its inputs, as torch's CPU attention fallback does, runs FP32).
"""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from tuner.core.dtypes import short_name
from tuner.core.inputs import ModelInputs
from tuner.core.sharding import is_fsdp, local_tensor
from tuner.engine.attach import attach, detach
from tuner.engine.function_mode import LOWER_DTYPES
from tuner.engine.tracker import ModuleTracker
from tuner.measure.flops import aten_flops, first_tensor
from tuner.measure.held import HeldLowered
from tuner.policy.opnames import ATEN_GEMMS, is_communication
from tuner.policy.plan import Plan

GEMMS = ATEN_GEMMS  # (the name benchmarks/aten_share.py and the tests know them by)
SHARE_TOLERANCE = 1e-9  # both shares are ratios of the same integer FLOP counts when they agree
_CASTS = frozenset({"_to_copy", "_autocast_to_reduced_precision"})
_FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


class NotAsClaimed(AssertionError):
    """mpt's own fault: the deployed model does not run what the plan and report claim (an internal error)."""


@dataclass
class Observation:
    """One deployed forward: `lowered` parameter name -> dtype, `gemms` module path -> the dtypes its
    matmul/conv ATen ops ran in, and the forward's output."""

    lowered: dict[str, torch.dtype] = field(default_factory=dict)
    gemms: dict[str, set[torch.dtype]] = field(default_factory=dict)
    output: Any = None
    # parameter name -> each (module path, was it a cast to the lower dtype) it was used by
    uses: dict[str, frozenset[tuple[str, bool]]] = field(default_factory=dict)
    foreign: bool = False  # a module ran called by a module that is not its ancestor (a shared module)
    flops: dict[torch.dtype, int] = field(default_factory=dict)  # matmul/conv FLOPs by the dtype they ran in
    nested: bool = False  # a matmul ran on a NestedTensor (an nn.TransformerEncoder dropped its padding)

    @property
    def flop_share(self) -> float:
        """The share of the matmul/conv FLOPs that ran in bf16/fp16, counted per ATen call."""
        total = sum(self.flops.values())
        return sum(n for d, n in self.flops.items() if d in LOWER_DTYPES) / total if total else 0.0


def _storage(t: Tensor) -> int | None:
    t = local_tensor(t)  # a DTensor (tensor parallel) is used through its local shard
    try:
        return t.untyped_storage().data_ptr() if t.layout is torch.strided and t.device.type != "meta" else None
    except (RuntimeError, NotImplementedError):  # tensors with no storage (subclasses, functional wrappers)
        return None


class _Recorder(TorchDispatchMode):
    """Parameter uses (by storage, so views and tied weights count as their parameter) and GEMM dtypes."""

    def __init__(self, params: dict[int, list[str]], lower: AbstractSet[torch.dtype], tracker: ModuleTracker) -> None:
        super().__init__()
        self.params = params
        self.lower = lower  # the plan's 16-bit dtypes: its own, and its fallback's (a fallback chain)
        self.tracker = tracker
        self.uses: dict[str, set[tuple[str, bool]]] = {}  # parameter name -> (module path, a cast to `lower`?)
        self.cast_to: dict[str, set[torch.dtype]] = {}  # parameter name -> the 16-bit dtypes it was cast to
        self.gemms: dict[str, set[torch.dtype]] = {}
        self.flops: dict[torch.dtype, int] = {}
        self.nested = False
        self.foreign = False

    def entered(self, module: nn.Module, path: str) -> None:
        """The tracker's on_enter: note a module run by one that is not its ancestor (its region is then
        its caller's, not its own: `tuner.measure.lowering` cannot predict it)."""
        st = self.tracker.stack
        caller = st[-1][1] if st else ""
        if caller not in ("", path) and not path.startswith(caller + "."):
            self.foreign = True

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, Tensor)]
        aliases = {_storage(t) for t in tree_leaves(out) if isinstance(t, Tensor)}
        for t in tensors if not is_communication(name) else ():  # FSDP2 gathering a shard is no use of it
            key = _storage(t)
            if key is None or key not in self.params or key in aliases:  # a view of a parameter is no use of it
                continue
            cast = name in _CASTS and isinstance(out, Tensor) and out.dtype in self.lower and out.dtype != t.dtype
            for param in self.params[key]:  # by name: a gathered (FSDP2) parameter's storage is freed after use
                self.uses.setdefault(param, set()).add((self.tracker.current_path(), cast))
                if cast:
                    self.cast_to.setdefault(param, set()).add(out.dtype)
        if name in GEMMS:
            dtypes = {t.dtype for t in tensors if t.dtype in _FLOATS}
            if dtypes:
                self.gemms.setdefault(self.tracker.current_path(), set()).update(dtypes)
            first = first_tensor(out)
            self.nested = self.nested or (first is not None and first.is_nested)
            if first is not None:  # complex matmuls (a spectral layer's einsum) count too, never low
                self.flops[first.dtype] = self.flops.get(first.dtype, 0) + aten_flops(name, args, kwargs, out)
        return out


def observe(model: nn.Module, plan: Plan, inputs: ModelInputs | tuple) -> Observation:
    """Run `inputs` once through `model` with `plan` attached (no grad) and record it (module docstring).

    The random number generators are seeded alike for every such forward and put back after it. `model` is
    left as it was (detached)."""
    inputs = ModelInputs.of(inputs)
    recorder = _recorder_for(model, plan)
    tracker = recorder.tracker
    attach(model, plan)
    tracker.install()
    hooks = _name_gathered(model, recorder.params)
    try:
        with torch.no_grad(), torch.random.fork_rng(), recorder:
            torch.manual_seed(0)  # a forward that draws random numbers draws the same ones every time
            output = inputs.call(model)
    finally:
        for hook in hooks:
            hook.remove()
        tracker.remove()
        detach(model)
    return _observation(recorder, output)


def _recorder_for(model: nn.Module, plan: Plan) -> _Recorder:
    """A recorder of one forward of `model` under `plan`: its floating parameters by storage, its own module
    tracker (`recorder.tracker`, not installed yet), and the plan's 16-bit dtypes."""
    params: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        key = _storage(p)
        if key is not None and p.is_floating_point():
            params.setdefault(key, []).append(name)
    entered: list[Any] = []
    tracker = ModuleTracker(model, on_enter=lambda module, path: entered[0](module, path))
    lower = {plan.torch_dtype} | ({plan.fallback_dtype} if plan.fallback_dtype is not None else set())
    recorder = _Recorder(params, lower, tracker)
    entered.append(recorder.entered)
    return recorder


def _observation(recorder: _Recorder, output: Any) -> Observation:
    """What `recorder` saw of one forward, and its output."""
    # stored in the one 16-bit dtype every use casts it to; FP32 where two dtypes read it (a fallback chain)
    lowered = {name: next(iter(recorder.cast_to[name])) for name, found in recorder.uses.items()
               if all(cast for _, cast in found) and len(recorder.cast_to.get(name, ())) == 1}
    uses = {name: frozenset(found) for name, found in recorder.uses.items()}
    return Observation(lowered, recorder.gemms, output, uses, recorder.foreign, recorder.flops, recorder.nested)


class FirstCall:
    """Observes the first call of `model`'s forward inside a block where `plan` is attached already (a trial's
    evaluate, the model lent as `tuner.load` builds it): the same record `observe` makes, with no forward of
    its own. Only a call whose arguments are `inputs` (`same(args, kwargs)` says) is observed, and only the
    first call is looked at, so the rest of the block runs unwatched. Unlike `observe`, nothing is seeded (the
    block's random draws are its own) and grad mode is the block's: the record is for dtypes and FLOPs, which
    neither changes. `close` ends it (removing its hooks) however the block ended; `seen` is the record, or
    None when the first call was not on `inputs` or raised."""

    def __init__(self, model: nn.Module, plan: Plan, same: Callable[[tuple, dict], bool]) -> None:
        self.model, self.plan, self.same = model, plan, same
        self.seen: Observation | None = None
        self._recorder: _Recorder | None = None
        self._tracker: ModuleTracker | None = None
        self._depth = 0  # calls of the root inside the watched one (a forward that calls itself)
        self._handles = [model.register_forward_pre_hook(self._enter, with_kwargs=True),
                         model.register_forward_hook(self._exit, always_call=True)]

    def _enter(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if self._recorder is not None:  # the watched forward calls the model again: part of it
            self._depth += 1
            return
        try:  # (a forward a compiler traces is not watched: a dispatch mode entered there would break its graph)
            same = not torch.compiler.is_compiling() and self.same(args, kwargs)
        except Exception:  # noqa: BLE001 - arguments that do not compare are not known to be the inputs
            same = False
        if not same:
            self._remove_hooks()
            return
        recorder = _recorder_for(module, self.plan)
        tracker = recorder.tracker
        tracker.install()
        tracker.enter_module(module)  # the global pre-hook it installed comes after this call's
        self._tracker, self._recorder = tracker, recorder
        recorder.__enter__()

    def _exit(self, module: nn.Module, args: tuple, output: Any) -> None:
        if self._depth:  # a call inside the watched one ends
            self._depth -= 1
            return
        self._finish(keep=sys.exc_info()[0] is None)  # (torch runs an always-called hook in its `except` block)

    def _finish(self, keep: bool) -> None:
        """End the watch: hooks removed, the record kept as `seen` when `keep` (the watched forward returned)."""
        self._remove_hooks()
        recorder, tracker = self._recorder, self._tracker
        self._recorder = self._tracker = None
        if recorder is None or tracker is None:
            return
        recorder.__exit__(None, None, None)
        tracker.exit_module(self.model)
        tracker.remove()
        self.seen = _observation(recorder, None) if keep else None

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()

    def close(self, failed: bool = False) -> None:
        """Remove what is left (a block that never called the forward, or one whose forward raised: then
        nothing is kept, `failed`)."""
        if self._recorder is not None:  # the watched forward never returned through its hook
            self._finish(keep=False)
        self._remove_hooks()
        if failed:
            self.seen = None


def _name_gathered(model: nn.Module, params: dict[int, list[str]]) -> list[Any]:
    """Under FSDP2 a module's forward uses parameters gathered whole for it, in storage of their own: name
    them (by each module's own parameter names) while that module runs, so their uses count for the
    parameter they are. Hooks that the caller removes; none for a model without FSDP2."""
    if not is_fsdp(model):
        return []
    hooks = []
    for path, module in model.named_modules():
        added: list[int] = []

        def enter(mod: nn.Module, _args: Any, prefix: str = f"{path}." if path else "",
                  added: list[int] = added) -> None:
            for name, p in mod.named_parameters(recurse=False):
                key = _storage(p)
                if key is not None and p.is_floating_point() and key not in params:
                    params[key] = [prefix + name]
                    added.append(key)

        def leave(_mod: nn.Module, _args: Any, _out: Any, added: list[int] = added) -> None:
            while added:  # the gathered storage is freed after the forward: another tensor may get its address
                params.pop(added.pop(), None)

        hooks += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    return hooks


def gemm_mismatches(ran: Mapping[str, AbstractSet[torch.dtype]], claimed: Mapping[str, AbstractSet[torch.dtype]],
                    tolerated: Mapping[str, AbstractSet[torch.dtype]] | None = None) -> list[str]:
    """Modules whose matmuls/convs ran in a dtype the plan does not claim for them (nor for a module below
    them: a fused kernel does their work; nor for another op of theirs, in `tolerated`), or that the plan
    claims ran in a dtype none of them (nor any module below or above them) ran in; one line each."""
    tolerated = tolerated or {}
    def below(path: str, table: Mapping[str, AbstractSet[torch.dtype]]) -> set[torch.dtype]:
        return {d for p, ds in table.items() if p == path or path in ("", "-") or p.startswith(path + ".")
                for d in ds}

    def above(path: str, table: Mapping[str, AbstractSet[torch.dtype]]) -> set[torch.dtype]:
        return {d for p, ds in table.items() if p != path and (p == "" or path.startswith(p + ".")) for d in ds}

    problems = []
    for path in sorted(set(ran) | set(claimed)):
        extra = ran.get(path, set()) - below(path, claimed) - tolerated.get(path, set())
        missing = claimed.get(path, set()) - below(path, ran) - above(path, ran)
        if extra or missing:
            problems.append(f"{path or '(root)'}: matmuls/convs ran in {_names(ran.get(path, set()))}, the plan "
                            f"claims {_names(claimed.get(path, set()))}")
    return problems


def _dtype_share_problems(seen: Observation, by_dtype: Mapping[str, float]) -> list[str]:
    """One line per 16-bit dtype whose share of the deployed forward's matmul/conv FLOPs (per ATen call) is not
    the report's (`by_dtype`, by short name; a dtype it leaves out: 0)."""
    total = sum(seen.flops.values())
    problems = []
    for dtype in sorted(LOWER_DTYPES, key=str):
        ran = seen.flops.get(dtype, 0) / total if total else 0.0
        said = by_dtype.get(short_name(dtype), 0.0)
        if abs(ran - said) > SHARE_TOLERANCE:
            problems.append(f"the report says {said:.6%} of matmul/conv FLOPs ran in {short_name(dtype)}, "
                            f"{ran:.6%} did (counted per ATen call)")
    return problems


def _names(dtypes: AbstractSet[torch.dtype]) -> str:
    return ",".join(sorted(str(d).replace("torch.", "") for d in dtypes)) or "none"


def weight_dtypes(model: nn.Module, plan: Plan, inputs: ModelInputs | tuple) -> dict[str, torch.dtype]:
    """The parameters `tuner.load` gets in a lower dtype under `plan` (name -> dtype): those every use of
    which, in the deployed forward of the FP32 model on `inputs`, is a cast to the plan's lower dtype.

    The trials run with these stored lowered (`stored_as`) and the checkpoint stores them so: a kernel
    that picks its path by the weights' dtype (`nn.MultiheadAttention`'s fast path) takes the same path in
    both."""
    return observe(model, plan, inputs).lowered


@contextlib.contextmanager
def stored_as(model: nn.Module, dtypes: Mapping[str, torch.dtype]) -> Iterator[nn.Module]:
    """`model` with the named parameters held in the given dtypes (as `tuner.load` builds it from the
    checkpoint), their FP32 tensors put back when the block ends.

    How they are held: `tuner.measure.held`. A sharded model's parameters (DTensors) stay FP32: FSDP2
    gathers from its own copy of the shards, and a bf16 value widened to FP32 and cast back is the same bf16,
    so the trials compute what the checkpoint (lowered, loaded into FP32 shards) computes."""
    held = HeldLowered()
    try:
        held.match(model, dtypes)
        yield model
    finally:
        held.release()


Holding = Callable[[nn.Module, Mapping[str, torch.dtype]], AbstractContextManager[nn.Module]]
"""How a caller holds a model's parameters lowered for a block: `stored_as`, or the model keeper's own holding
(`tuner.workspace.keeper`), which keeps them held after the block so the next block needs no packing."""


def verify(model: nn.Module, plan: Plan, inputs: ModelInputs | tuple, lowered: Mapping[str, torch.dtype],
           claimed: Mapping[str, AbstractSet[torch.dtype]],
           tolerated: Mapping[str, AbstractSet[torch.dtype]], *, hold: Holding = stored_as,
           share: float | None = None, by_dtype: Mapping[str, float] | None = None,
           seen: Observation | None = None) -> Observation:
    """The deployed forward (the model as the trials ran it: `lowered` stored lowered, the plan attached),
    after checking that its matmuls/convs ran in the dtypes the plan claims: `claimed` (module path -> the
    dtypes its matmul/conv ops computed in under the plan; `tolerated`: the dtypes of its other ops, whose
    kernels may multiply matrices too). NotAsClaimed, naming the modules, when they did not; and when `share` (the
    report's share of matmul/conv FLOPs in the lower dtype) is not the share the deployed forward ran low,
    counted per ATen call (`Observation.flop_share`: what `benchmarks/aten_share.py` counts), unless the forward
    ran matmuls on NestedTensors (an nn.TransformerEncoder that dropped its padding computes fewer FLOPs than the
    padded forward the report counts: a known difference, not a dtype one); and likewise for each 16-bit dtype's
    share in `by_dtype` (the report's, by short name: a fallback chain's plan runs two). `hold`: how
    `lowered` is held (`Holding`). `seen`: that forward as observed already (`FirstCall`, in the evaluation
    of this plan with `lowered` held: the same model on the same inputs), checked without one of its own."""
    if seen is None:
        with hold(model, lowered):
            seen = observe(model, plan, inputs)
    problems = gemm_mismatches(seen.gemms, claimed, tolerated)
    if share is not None and not seen.nested and abs(seen.flop_share - share) > SHARE_TOLERANCE:
        problems.insert(0, f"the report says {share:.6%} of matmul/conv FLOPs ran in {plan.dtype}, "
                           f"{seen.flop_share:.6%} did (counted per ATen call: "
                           + ", ".join(f"{_names({d})} {n}" for d, n in sorted(seen.flops.items(), key=str)) + ")")
    if by_dtype is not None and not seen.nested:
        problems[:0] = _dtype_share_problems(seen, by_dtype)
    if problems:
        raise NotAsClaimed("the deployed model does not run what the plan claims (an mpt bug): "
                           + "; ".join(problems[:5]))
    return seen

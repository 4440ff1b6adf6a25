"""Run a plan with torch's own mechanisms only, so `torch.compile` and `torch.export` see plain torch code.

A plan on a torch-* preset differs from `torch.autocast` only by its FP32
overrides. Those are realized as *regions*, with no Python per op:

- the model runs under `torch.autocast(device, dtype)`;
- a module that owns an FP32 op instance is an **FP32 island**: its forward
  runs under `torch.autocast(enabled=False)` with its float inputs cast to
  FP32, so every op its own code calls computes in FP32;
- a child of an island that has no override of its own runs low again
  (autocast re-enabled) and hands FP32 outputs back, so the island's own ops
  keep computing in FP32;
- a module override to FP32 (`modules: {rnn: fp32}`) makes the whole subtree FP32;
- a torch.autocast block the model opens itself decides for everything called in it (`_in_model_block`).

The unit is the module that calls the op (its *owner*), not the single call:
`mpt tune` searches over these units, so a tuned plan lists every
lower-precision op its FP32 modules call and this realization runs exactly
the plan. A hand-written plan that names one call of a module that calls
others runs all of that module's own ops in FP32 here (`engine="python"`
keeps per-call granularity). Plans that regions cannot express (another
lower dtype for a module, replaced op lists, non-torch presets) get a reason
string from `realize` instead and run under mpt's engine.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence
from torch.utils._pytree import tree_leaves, tree_map

from tuner.core.torch_state import autocast_nesting
from tuner.engine import grouped

FP32 = torch.float32


class ExecutionPath(str, enum.Enum):
    """How an attached plan runs."""

    NATIVE = "native"  # torch.autocast + FP32 regions: compiles and exports
    SCOPED = "scoped"  # torch.autocast + mpt's Python engine inside some modules
    PYTHON = "python"  # mpt's Python engine for the whole forward


@dataclass(frozen=True)
class Execution:
    """What `tuner.attached(model)` reports about an attached plan: which path runs it and, on the
    native path, which modules run as FP32 regions. `describe()` is the one-line text `mpt` prints."""

    path: ExecutionPath
    device: str | None = None  # torch.autocast's device type on the native path
    dtype: torch.dtype | None = None
    fp32_islands: tuple[str, ...] = ()  # modules whose own ops run FP32 (children keep the plan)
    fp32_subtrees: tuple[str, ...] = ()  # modules that run FP32 with everything below them
    python_modules: tuple[str, ...] = ()  # modules under mpt's engine on the scoped path
    unnested: tuple[str, ...] = ()  # nn.TransformerEncoders that fall back from the nested-tensor path (`install`)
    reason: str = ""  # why the plan is not native, when it is not
    unfused: tuple[str, ...] = ()  # nn.TransformerEncoderLayers whose fused fast path is off (`install`)

    def describe(self) -> str:
        if self.path is ExecutionPath.NATIVE:
            parts = [f"{len(self.fp32_islands)} FP32 island(s)"] if self.fp32_islands else []
            parts += [f"{len(self.fp32_subtrees)} FP32 subtree(s)"] if self.fp32_subtrees else []
            extra = f" with {', '.join(parts)}" if parts else ""
            fast = self.fast_paths()
            return f"native: torch.autocast({self.device}, {short(self.dtype)}){extra}" + (f"; {fast}" if fast else "")
        if self.path is ExecutionPath.SCOPED:
            return f"scoped: torch.autocast, mpt's engine in {len(self.python_modules)} module(s) ({self.reason})"
        return f"python: mpt's engine for every op ({self.reason})"

    def fast_paths(self) -> str:
        """What the plan turns off of torch's fused fast paths, in words ("" when nothing): a user who timed
        the FP32 model on them must be told why the tuned one does not take them (`install`)."""
        parts = [f"fused fast path off in {len(self.unfused)} nn.TransformerEncoderLayer(s)"] if self.unfused else []
        if self.unnested:
            parts.append(f"{len(self.unnested)} nn.TransformerEncoder(s) unnested where a layer refuses the "
                         "NestedTensor")
        return "; ".join(parts)


class _Region(enum.Enum):
    LOW = "low"
    FP32 = "fp32"


def realize(model: nn.Module, device: str, lower: torch.dtype, module_overrides: Mapping[str, torch.dtype],
            instance_overrides: Mapping[tuple[str, str, int], torch.dtype]) -> Execution | str:
    """The native execution of a plan on `model`, or why there is none (a reason string)."""
    other = sorted(p for p, d in module_overrides.items() if d != FP32)
    if other:
        return f"module override to {short(module_overrides[other[0]])} ({other[0]}): torch.autocast lowers " \
               "only its own op lists"
    if any(d != FP32 for d in instance_overrides.values()):
        return "an op instance override to a lower dtype"
    paths = [p for p, _ in model.named_modules()]
    subtrees = _outermost({p for p in paths if any(p == q or fnmatchcase(p, q) for q in module_overrides)})
    inside = {p for p in paths if _under_any(p, subtrees)}
    known = set(paths)
    islands = sorted({key[0] for key in instance_overrides if key[0] in known and key[0] not in inside})
    unnested = sorted(p for p, m in model.named_modules() if isinstance(m, nn.TransformerEncoder) and p not in inside
                      and getattr(m, "use_nested_tensor", False))
    unfused = sorted(p for p, m in model.named_modules() if isinstance(m, nn.TransformerEncoderLayer)
                     and p not in inside)
    return Execution(ExecutionPath.NATIVE, device, lower, tuple(islands), tuple(sorted(subtrees)),
                     unnested=tuple(unnested), unfused=tuple(unfused))


# (module, the forward it had in its __dict__ before or None or _UNCHANGED, the hook install added or None)
Wrapped = list[tuple[nn.Module, Any, Any]]
_UNCHANGED = object()  # the module's forward was left as it was (it only got a hook)


def install(model: nn.Module, execution: Execution) -> Wrapped:
    """Wrap the forwards whose region differs from an ancestor's (the root always); returns what
    `uninstall` needs, root first.

    A module may be called by any of its ancestors, not only its parent: containers (`nn.ModuleList`,
    `nn.ModuleDict`) and parametrizations are never called themselves. So every module whose region differs
    from that of some ancestor gets a wrapper, and the wrapper switches region only when the one it is
    called in is not its own (`torch.is_autocast_enabled`): each module's own ops run in its region
    whoever calls it, and a wrapper called in its own region is a plain call. Inside a torch.autocast block
    the model opened itself no wrapper switches (`_in_model_block`): the model's block decides, as
    torch.autocast runs it. The only state is the per-thread depth of each region switch, which a
    wrapper pushes and pops around its own call: compilers trace its reads as constants and guard on
    nothing that changes per call.

    An FP32 island, and an `nn.TransformerEncoderLayer` in a low region, also get a forward pre-hook that
    does nothing: torch's fused fast path (`nn.TransformerEncoderLayer` in eval mode with no grad) runs the
    whole layer as one FP32 kernel that reads its children's weights directly, which torch.autocast on CPU
    does not lower, so the layer would not run what the plan says (its children low); the fast path
    stands down when a module of the layer has hooks (`Execution.unfused` lists these layers, and
    `describe()` says so). Under an FP32 module override it may run: all FP32. An FP32 region the model opens
    itself (`torch.autocast(enabled=False)`) is no override: mpt cannot see it before the call, so the fast
    path stays off there too, and such a layer runs unfused in FP32 as the trials ran it.

    An `nn.TransformerEncoder` given a padding mask turns its input into a NestedTensor when its first layer
    looks fit for the fused path (CPU autocast does not stop it), and a layer that then cannot take that path
    (its weights stored lowered) fails on the NestedTensor (issue 34). Outside FP32 subtrees such an encoder
    (`Execution.unnested`) runs as torch runs it and, where a layer refuses the NestedTensor, again without
    nesting; where one of its self-attentions runs low, without nesting at once, as its lowered weights make it
    run whatever weights it holds (`_unnested_fallback`, issue 40): its padded positions are then computed as
    unfused layers compute them, not zeros, as in any model whose layers cannot fuse. Where every layer takes
    the NestedTensor (their self-attention's weights FP32: an FP32 island, or a region the model keeps FP32
    itself) the encoder stays nested and its unfused layers run on the NestedTensor (MultiheadAttention's fused
    kernel, NestedTensor linears), in the trials as after `tuner.load`: `tuner.measure.deployed` counts those
    linears as matmuls.
    """
    assert execution.path is ExecutionPath.NATIVE and execution.device and execution.dtype
    fp32_own = set(execution.fp32_islands)
    fp32_tree = set(execution.fp32_subtrees)
    wrapped: Wrapped = []
    seen: set[int] = set()
    for path, module in model.named_modules():
        if id(module) in seen:
            continue
        seen.add(id(module))
        region = _region_of(path, fp32_own, fp32_tree)
        fused = path in fp32_own or path in execution.unfused
        hook = module.register_forward_pre_hook(_no_fast_path) if fused else None
        ancestors = [path.rsplit(".", k)[0] for k in range(1, path.count(".") + 1)] + ([""] if path else [])
        if path == "" or any(_region_of(a, fp32_own, fp32_tree) is not region for a in ancestors):
            wrapped.append((module, module.__dict__.get("forward"), hook))
            module.forward = _region_forward(module.forward, region, execution.device, execution.dtype,
                                             root=path == "", module=module)
        elif hook is not None:
            wrapped.append((module, _UNCHANGED, hook))
        if path in execution.unnested:  # see the docstring
            wrapped.append((module, module.__dict__.get("forward"), None))
            module.forward = _unnested_fallback(module, module.forward,
                                                nest=_attention_fp32(path, module, fp32_own, fp32_tree))
    grouped.wrap_owners(model, execution.device, wrapped, _in_model_block)  # grouped GEMMs lowered (issue 44)
    return wrapped


def _attention_fp32(path: str, encoder: nn.Module, fp32_own: set[str], fp32_tree: set[str]) -> bool:
    """Every self-attention of the nn.TransformerEncoder at `path` runs in an FP32 region: the only encoder whose
    layers all take a NestedTensor when its weights are stored as the plan stores them (`install`)."""
    found = [f"{path}.{name}" if path else name for name, sub in encoder.named_modules()
             if isinstance(sub, nn.MultiheadAttention)]
    return bool(found) and all(_region_of(p, fp32_own, fp32_tree) is _Region.FP32 for p in found)


def _unnested_fallback(module: nn.Module, forward: Callable[..., Any], *, nest: bool = True) -> Callable[..., Any]:
    """`forward` of an nn.TransformerEncoder, run once more without the nested-tensor path when a layer refused
    the NestedTensor it was handed (`install`): the same call, with `use_nested_tensor` off for its length.

    `nest=False` (a self-attention of the encoder runs low): the call is run unnested at once. With its weights
    stored lowered, as the trials and the checkpoint hold them, such a layer refuses the NestedTensor (or fails on
    it); with the FP32 weights a `Plan` is attached to (`tuner.load(model, plan)`) it would take it, and the
    loaded model would run another path than the trials measured (issue 40)."""
    @functools.wraps(forward)
    def unnested(*args: Any, **kwargs: Any) -> Any:
        if nest:
            try:
                return forward(*args, **kwargs)
            except AssertionError as exc:
                if "NestedTensor" not in str(exc) or not getattr(module, "use_nested_tensor", False):
                    raise
        elif not getattr(module, "use_nested_tensor", False):
            return forward(*args, **kwargs)
        setattr(module, "use_nested_tensor", False)  # noqa: B010 - an nn.Module attribute mypy types as a Tensor
        try:
            return forward(*args, **kwargs)
        finally:
            setattr(module, "use_nested_tensor", True)  # noqa: B010

    return unnested


def _no_fast_path(module: nn.Module, args: Any) -> None:
    """The pre-hook of an FP32 island (see `install`): its presence is what counts."""


def _region_of(path: str, fp32_own: set[str], fp32_tree: set[str]) -> _Region:
    return _Region.FP32 if path in fp32_own or _under_any(path, fp32_tree) else _Region.LOW


def uninstall(wrapped: Wrapped) -> None:
    """Give every wrapped module back the forward it had (its class's, or one set on the instance before)."""
    for module, before, hook in reversed(wrapped):
        if hook is not None:
            hook.remove()
        if before is _UNCHANGED:
            continue
        if before is None:
            module.__dict__.pop("forward", None)
        else:
            module.forward = before


def _region_forward(original: Callable[..., Any], region: _Region, device: str, lower: torch.dtype, *,
                    root: bool, module: nn.Module) -> Callable[..., Any]:
    """`original` (`module`'s forward) run in `region`. An FP32 region's inputs are cast to FP32 on the way in: its
    arguments, and the attributes of `module` a caller set to low-precision tensors (`_attributes_to_fp32`)."""
    if region is _Region.FP32:
        @functools.wraps(original)
        def fp32_forward(*args: Any, **kwargs: Any) -> Any:
            if not root and (not torch.is_autocast_enabled(device) or _in_model_block()):  # FP32 already, or the
                return original(*args, **kwargs)  # model's own autocast block decides
            swapped = _attributes_to_fp32(module)
            try:
                with torch.autocast(device, enabled=False):
                    return _in_region(original, _to_fp32(args), _to_fp32(kwargs))
            finally:
                _put_back(module, swapped)

        return fp32_forward

    @functools.wraps(original)
    def low_forward(*args: Any, **kwargs: Any) -> Any:
        if not root and (torch.is_autocast_enabled(device) or _in_model_block()):  # low already, or the model's
            return original(*args, **kwargs)  # own autocast block decides (its FP32 block stays FP32)
        with low_autocast(device, lower):
            out = _in_region(original, args, kwargs)
        return out if root else _to_fp32(out)  # back inside an FP32 island: its own ops compute in FP32

    return low_forward


class _RegionDepths(threading.local):
    """torch.autocast's nesting depth just inside each region switch of this thread, innermost last.

    A wrapper decides from the autocast state it is called in, but "autocast off" has two causes that the
    state cannot tell apart: an FP32 island's wrapper turned it off, or the model's own code opened
    `torch.autocast(enabled=False)` (an HF rotary embedding, an FP32 head), which inherits every setting
    an island's block has. Only the nesting depth differs: a block the model opened since the innermost
    switch is one deeper. Per thread: threads running one model each nest their own blocks."""

    def __init__(self) -> None:
        self.depths: list[int] = []


_DEPTHS = _RegionDepths()


def _in_region(original: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """`original(*args, **kwargs)` inside a region switch (its autocast block entered): the depth recorded
    for `_in_model_block` while it runs."""
    depths = _DEPTHS.depths
    depths.append(autocast_nesting())
    try:
        return original(*args, **kwargs)
    finally:
        depths.pop()


def _in_model_block() -> bool:
    """Called inside a torch.autocast block the model opened itself since the innermost region switch: there
    the model decides, as torch.autocast runs it (and as `PrecisionEngine._model_region` claims), so a
    wrapper called in it does not switch. Outside every region (a submodule called on its own) no block
    is the model's."""
    depths = _DEPTHS.depths
    return bool(depths) and autocast_nesting() > depths[-1]


def low_autocast(device: str, dtype: torch.dtype) -> torch.autocast:
    """torch.autocast for a low region, with its weight cache only where it pays: under grad mode.

    The cache keeps a lower-precision copy of every parameter that requires grad until the outermost autocast
    exits: in an inference forward (no_grad, each weight used once) that is a second copy of the model's
    matmul weights in memory (+0.5x the FP32 parameter bytes in bf16) for nothing. Without it each cast
    copy is freed after its op; only a weight used several times in one forward is cast again. Nor inside
    another autocast block (the caller's, or a `tuner.autocast` opened around a training loop): the cache lives
    until the outermost block exits, so its casts would outlive the optimizer step after this forward.
    """
    return torch.autocast(device, dtype=dtype, cache_enabled=torch.is_grad_enabled() and autocast_nesting() == 0)


_LOW = (torch.bfloat16, torch.float16)


def fp32_outputs(forward: Callable[..., Any]) -> Callable[..., Any]:
    """`forward` handing its lower-precision float outputs back in FP32 (`_to_fp32`): what a training plan's
    attached root returns (`tuner.engine.attach`), so the loss and the metric computed on them outside the
    forward run in FP32, as torch.autocast's FP32 list runs a loss on its low outputs."""
    @functools.wraps(forward)
    def fp32_forward(*args: Any, **kwargs: Any) -> Any:
        return _to_fp32(forward(*args, **kwargs))

    return fp32_forward


def _to_fp32(x: Any) -> Any:
    """Lower-precision float tensors in `x` as FP32, found by structure: any container torch's pytree knows
    (tuples, NamedTuples, lists, dicts, Hugging Face `ModelOutput`s) and dataclasses; anything else as is. What
    crosses into an FP32 island must arrive in FP32 in whatever it is wrapped in (issue 34: a NamedTuple of
    tensors reached an FP32 linear in bf16). A container with nothing to cast is handed on as it came."""
    if isinstance(x, torch.Tensor):
        return x.float() if x.dtype in _LOW else x
    leaves = tree_leaves(x)
    if not any(isinstance(t, torch.Tensor) and t.dtype in _LOW or _is_dataclass(t) for t in leaves):
        return x
    if isinstance(x, PackedSequence):  # a NamedTuple whose constructor checks its fields: only its data is cast
        return x._replace(data=_to_fp32(x.data))
    return tree_map(_leaf_to_fp32, x)


# what every nn.Module holds in its __dict__ (parameters, buffers, children, hooks, flags): never an input
_MODULE_STATE = frozenset(vars(nn.Module()))
_Swapped = list[tuple[str, Any, Any]]  # (attribute, what the caller set, what the island saw)


def _attributes_to_fp32(module: nn.Module) -> _Swapped:
    """Low-precision tensors a caller handed to an FP32 island as attributes of it (`self.island.ctx = h` before
    `self.island(x)`, issue 34), set to their FP32 casts for the island's call; `_put_back` restores the
    caller's objects after it. An input is an input however it is passed: as an argument it is cast by
    `_to_fp32`, so as an attribute too (by the same structure rules). Only the island's own attributes: what
    its code hands its children comes from it (FP32, or cast back by their wrappers); the module's own state
    and mpt's (`_mpt_*`: the attachment of a root island) are left alone, so a call walks one small dict."""
    swapped: _Swapped = []
    for name, value in vars(module).items():
        if name in _MODULE_STATE or name.startswith("_mpt") or \
                not isinstance(value, torch.Tensor | tuple | list | dict) and not _is_dataclass(value):
            continue
        cast = _to_fp32(value)
        if cast is not value:
            swapped.append((name, value, cast))
    for name, _, cast in swapped:
        module.__dict__[name] = cast
    return swapped


def _put_back(module: nn.Module, swapped: _Swapped) -> None:
    """The caller's attribute objects back, where the island's forward did not replace them with its own."""
    for name, value, cast in swapped:
        if module.__dict__.get(name) is cast:
            module.__dict__[name] = value


def _leaf_to_fp32(leaf: Any) -> Any:
    if isinstance(leaf, torch.Tensor):
        return leaf.float() if leaf.dtype in _LOW else leaf
    if _is_dataclass(leaf):
        found = {f.name: getattr(leaf, f.name) for f in dataclasses.fields(leaf) if f.init and hasattr(leaf, f.name)}
        cast = {name: _to_fp32(value) for name, value in found.items()}
        if any(cast[name] is not found[name] for name in found):
            return dataclasses.replace(leaf, **cast)
    return leaf


def _is_dataclass(x: Any) -> bool:
    return dataclasses.is_dataclass(x) and not isinstance(x, type)


def _outermost(paths: set[str]) -> set[str]:
    return {p for p in paths if not any(p != q and (q == "" or p.startswith(q + ".")) for q in paths)}


def _under_any(path: str, roots: set[str]) -> bool:
    return any(path == r or r == "" or path.startswith(r + ".") for r in roots)


def short(dtype: torch.dtype | None) -> str:
    return str(dtype).replace("torch.", "")

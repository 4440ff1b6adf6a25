"""Grouped GEMMs lowered on torch's own path, where torch.autocast does not lower them (issue 44).

transformers 5 runs an MoE layer's experts as two `torch._grouped_mm` calls (its default experts implementation,
`grouped_mm`), on weights held as 3-d parameters of the experts module (one matrix per expert), casting the
tokens to the weights' dtype first. torch.autocast lists no grouped GEMM, on CPU or CUDA: under it the experts,
most of an MoE model's FLOPs, compute in FP32. mpt's torch-* presets list `_grouped_mm` as a lower op
(`opnames.GROUPED_MM_OPS`), which mpt's engine applies like any list entry; the native path (`tuner.engine.native`,
what `tuner.load` runs) applies it here, so the trials, the claims and the loaded model compute the same.

A `TorchFunctionMode` that casts costs Python per op call, so it is entered only around the forward of a module
that may run one: a module owning a stack of matrices, a 3-d floating-point parameter that is not a
convolution's (`may_group`: transformers' experts modules, whose own forward calls `_grouped_mm`). Such a module
runs eagerly under torch.compile (a graph break around it): a traced graph would not hold the mode's casts. In
it, a grouped GEMM called while torch.autocast is on for the device (a low region) has its floating-point inputs
cast to torch.autocast's dtype, as torch.autocast casts a listed op; in an FP32 region (autocast off: an FP32
island or subtree, or a block the model opened itself) and inside a torch.autocast block the model opened itself
(where torch.autocast decides, as `PrecisionEngine` claims it) it runs as called. Elsewhere a grouped GEMM runs as
torch.autocast runs it: the deployed forward's check (`tuner.measure.deployed.verify`) says so where a plan
claimed otherwise. `tuner.autocast` on torch's own path is torch.autocast itself and leaves grouped GEMMs alone.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from tuner.policy.opnames import GROUPED_MM_OPS

_LOW = (torch.bfloat16, torch.float16)


def may_group(module: nn.Module) -> bool:
    """`module` owns a stack of matrices: a floating-point parameter of three dimensions, the first more than one
    (one matrix per expert), that is no convolution's or nn.Bilinear's weight. An experts module's own forward hands
    them to a grouped GEMM; a learned position embedding or class token (1 x tokens x width) is no stack."""
    if isinstance(module, (nn.modules.conv._ConvNd, nn.Bilinear)):
        return False
    return any(p.dim() == 3 and p.shape[0] > 1 and p.is_floating_point() for p in module.parameters(recurse=False))


class GroupedCasts(TorchFunctionMode):
    """Casts the floating-point inputs of each grouped GEMM (`GROUPED_MM_OPS`) to torch.autocast's dtype for
    `device` while autocast is on there and `in_model_block()` is False (see the module docstring)."""

    def __init__(self, device: str, in_model_block: Callable[[], bool]) -> None:
        super().__init__()
        self.device = device
        self.in_model_block = in_model_block

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if _grouped(func) and torch.is_autocast_enabled(self.device) and not self.in_model_block():
            dtype = torch.get_autocast_dtype(self.device)
            args = tuple(self._low(a, dtype) for a in args)
            kwargs = {k: self._low(v, dtype) if k != "out" else v for k, v in kwargs.items()}
        return func(*args, **kwargs)

    def _low(self, x: Any, dtype: torch.dtype) -> Any:
        """`x` in `dtype` when it is a floating-point tensor on the device (not float64), as torch.autocast casts."""
        if isinstance(x, Tensor) and x.is_floating_point() and x.dtype != torch.float64 and x.dtype != dtype \
                and x.device.type == self.device:
            return x.to(dtype)
        return x


# torch's functions named in GROUPED_MM_OPS (`torch._grouped_mm`), told by identity: a check torch.compile traces
# without a graph break (a name lookup would break the graph at every op call)
_FUNCS = tuple(getattr(torch, name) for name in sorted(GROUPED_MM_OPS) if callable(getattr(torch, name, None)))


def _grouped(func: Callable[..., Any]) -> bool:
    return any(func is f for f in _FUNCS)


Wrapped = list[tuple[nn.Module, Any, Any]]  # `tuner.engine.native.Wrapped`: (module, forward before, hook)


def wrap_owners(model: nn.Module, device: str, wrapped: Wrapped,
                in_model_block: Callable[[], bool] = lambda: False) -> None:
    """Wrap the forward of every module of `model` that may run a grouped GEMM (`may_group`) so that
    `GroupedCasts` is on while it runs with torch.autocast on; appended to `wrapped` (what `native.uninstall`
    undoes) only where no entry there replaced its forward already (that entry's restore undoes this too, and
    `tuner.engine.portable` keeps the forward it had before attach). `in_model_block`: whether a call is inside a
    torch.autocast block the model opened itself (`tuner.engine.native`'s regions tell; none on the scoped path)."""
    replaced = {id(m) for m, before, _ in wrapped if before is None or callable(before)}
    seen: set[int] = set()
    for _, module in model.named_modules():
        if id(module) in seen or not may_group(module):
            continue
        seen.add(id(module))
        if id(module) not in replaced:
            wrapped.append((module, module.__dict__.get("forward"), None))
        module.forward = _casting(module.forward, device, in_model_block)


def _casting(original: Callable[..., Any], device: str, in_model_block: Callable[[], bool]) -> Callable[..., Any]:
    """`original` with `GroupedCasts` on while autocast is on for `device`. Never traced: torch.compile runs the
    module eagerly (a graph break around it), since a graph it traced would not hold the mode's casts."""
    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_autocast_enabled(device):  # an FP32 region: nothing to cast, no Python per op
            return original(*args, **kwargs)
        with GroupedCasts(device, in_model_block):
            return original(*args, **kwargs)

    return torch.compiler.disable(forward)

"""One forward call's inputs (positional and keyword), and the tensors inside nested outputs.

HF models are called with keyword arguments (`model(input_ids=..., attention_mask=...)`)
and return dicts or dataclasses (`ModelOutput`); CNNs take one tensor and return one.
`ModelInputs` holds both kinds of call, and `float_leaves` / `map_tensors` walk
any output the way torch's own pytree would: tensors inside tuples, lists,
dicts (ModelOutput is one) and dataclasses.
"""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten


def map_tensors(x: Any, fn: Callable[[Tensor], Any]) -> Any:
    """`x` with every tensor inside it replaced by fn(tensor); containers keep their type."""
    if isinstance(x, Tensor):
        return fn(x)
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # namedtuple
        return type(x)(*(map_tensors(i, fn) for i in x))
    if isinstance(x, (list, tuple)):
        items = [map_tensors(i, fn) for i in x]
        return tuple(items) if isinstance(x, tuple) else items
    if isinstance(x, Mapping):
        mapped = {k: map_tensors(v, fn) for k, v in x.items()}
        try:
            rebuild: Any = type(x)  # ModelOutput, OrderedDict: built from a dict
            return rebuild(mapped)
        except Exception:  # noqa: BLE001 - a mapping type that cannot be built from a dict
            return mapped
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        try:
            return dataclasses.replace(x, **{f.name: map_tensors(getattr(x, f.name), fn)
                                             for f in dataclasses.fields(x) if f.init})
        except Exception:  # noqa: BLE001 - frozen or custom __init__: leave it as it is
            return x
    return x


def _clone(t: Tensor) -> Tensor:
    return t.detach().clone()


def detached_copy(x: Any, clone: Callable[[Tensor], Tensor] = _clone) -> Any:
    """A copy of an output that nothing done later to `x` can change: every tensor replaced by a detached
    clone (`clone`), every container rebuilt (tuples, namedtuples, lists, dicts, ModelOutput, dataclasses).

    What mpt keeps to compare with (the FP32 reference output) is made with this: a forward that returns
    the dict it was given, and fills the same dict on its next call, cannot rewrite the reference. A
    container found twice is copied once (the copy has the same tensor leaves as `x`); objects that are
    not containers are kept as they are (no error is computed over them).
    """
    return _copy(x, clone, {})


def _copy(x: Any, clone: Callable[[Tensor], Tensor], memo: dict[int, Any]) -> Any:
    if isinstance(x, Tensor):
        return clone(x)
    if id(x) in memo:  # shared, or a cycle (None: the copy is still being made)
        return memo[id(x)]
    if isinstance(x, (list, tuple, Mapping)) or (dataclasses.is_dataclass(x) and not isinstance(x, type)):
        memo[id(x)] = None
        memo[id(x)] = made = _rebuilt(x, clone, memo)
        return made
    return x


def _rebuilt(x: Any, clone: Callable[[Tensor], Tensor], memo: dict[int, Any]) -> Any:
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # namedtuple
        return type(x)(*(_copy(i, clone, memo) for i in x))
    if isinstance(x, (list, tuple)):
        items = [_copy(i, clone, memo) for i in x]
        return tuple(items) if isinstance(x, tuple) else items
    if isinstance(x, Mapping):
        mapped = {k: _copy(v, clone, memo) for k, v in x.items()}
        try:
            rebuild: Any = type(x)
            return rebuild(mapped)
        except Exception:  # noqa: BLE001 - a mapping type that cannot be built from a dict
            return mapped
    fields = {f.name: _copy(getattr(x, f.name), clone, memo) for f in dataclasses.fields(x) if hasattr(x, f.name)}
    made = copy.copy(x)  # a dataclass: frozen ones and those with their own __init__ included
    for name, value in fields.items():
        object.__setattr__(made, name, value)
    return made


def tensor_leaves(x: Any) -> list[Tensor]:
    """Every tensor inside `x` (tuples, lists, dicts, ModelOutput, dataclasses), in order."""
    found: list[Tensor] = []
    _collect(x, found, set())
    return found


def element_count(x: Any) -> int:
    """The tensor elements inside `x` (`tensor_leaves`): how much data a forward call is given, as a count a
    rerun gives again (what sizes an evaluate against a forward of the example inputs)."""
    return sum(t.numel() for t in tensor_leaves(x))


def _collect(x: Any, found: list[Tensor], seen: set[int]) -> None:
    if isinstance(x, Tensor):
        found.append(x)
        return
    if id(x) in seen:
        return
    if isinstance(x, (list, tuple)):
        seen.add(id(x))
        for i in x:
            _collect(i, found, seen)
    elif isinstance(x, Mapping):
        seen.add(id(x))
        for v in x.values():
            _collect(v, found, seen)
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        seen.add(id(x))
        for f in dataclasses.fields(x):
            _collect(getattr(x, f.name, None), found, seen)


def float_leaves(x: Any) -> list[Tensor]:
    """The floating-point tensors inside `x`: what an output's error is computed over."""
    return [t for t in tensor_leaves(x) if t.is_floating_point()]


@dataclass(frozen=True)
class ModelInputs:
    """The arguments of one forward call: `model(*args, **kwargs)`."""

    args: tuple = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, value: Any) -> ModelInputs:
        """What `example_inputs()` returned: a tuple of positional args, a dict of keyword args (HF style),
        or one object (a tensor), which is the only positional argument."""
        if isinstance(value, ModelInputs):
            return value
        if isinstance(value, tuple) and not hasattr(value, "_fields"):
            return cls(args=value)
        if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
            return cls(kwargs=dict(value))
        return cls(args=(value,))

    def call(self, fn: Callable[..., Any]) -> Any:
        return fn(*self.args, **self.kwargs)

    def elements(self) -> int:
        """The tensor elements of the call's arguments (`element_count`)."""
        return element_count((self.args, self.kwargs))

    def map(self, fn: Callable[[Tensor], Any]) -> ModelInputs:
        return ModelInputs(map_tensors(self.args, fn), {k: map_tensors(v, fn) for k, v in self.kwargs.items()})

    def to(self, device: str | torch.device) -> ModelInputs:
        return self.map(lambda t: t.to(device))

    def snapshot(self) -> ModelInputs:
        """A detached copy that later in-place changes of the caller's tensors cannot reach."""
        return self.map(lambda t: t.detach().clone())

    def named(self) -> list[tuple[str, Any]]:
        """Every argument under the name `flat` gives it: ("args.0", a), ("kwargs.input_ids", v), in call order."""
        return [(f"args.{i}", a) for i, a in enumerate(self.args)] + \
            [(f"kwargs.{k}", v) for k, v in self.kwargs.items()]

    def __iter__(self) -> Iterator[Any]:
        """The positional args, for code written when inputs were a tuple (`model(*inputs)`).

        Refused when there are keyword args, which unpacking would silently drop: use `.call(model)`.
        """
        if self.kwargs:
            raise TypeError(f"these inputs have keyword arguments ({', '.join(self.kwargs)}); unpacking them as "
                            "positional args would drop those: call the model with ModelInputs.call")
        return iter(self.args)

    def flat(self) -> dict[str, Tensor] | None:
        """{"args.0": t, "kwargs.input_ids": t} when every argument is a tensor or None (what safetensors
        can hold); None otherwise."""
        out: dict[str, Tensor] = {}
        for name, value in [(f"args.{i}", a) for i, a in enumerate(self.args)] + \
                [(f"kwargs.{k}", v) for k, v in self.kwargs.items()]:
            if isinstance(value, Tensor):
                out[name] = value
            elif value is not None:
                return None
        return out

    @classmethod
    def from_flat(cls, tensors: Mapping[str, Tensor]) -> ModelInputs:
        """The inverse of `flat` (None arguments were dropped by it and stay dropped)."""
        args = [(int(k.split(".", 1)[1]), v) for k, v in tensors.items() if k.startswith("args.")]
        kwargs = {k.split(".", 1)[1]: v for k, v in tensors.items() if k.startswith("kwargs.")}
        return cls(tuple(v for _, v in sorted(args)), kwargs)

    def describe(self) -> str:
        parts = [_shape(a) for a in self.args] + [f"{k}={_shape(v)}" for k, v in self.kwargs.items()]
        return "(" + ", ".join(parts) + ")"


def _shape(x: Any) -> str:
    if isinstance(x, Tensor):
        return f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}"
    return type(x).__name__


def same_inputs(a: ModelInputs, b: ModelInputs) -> bool:
    """Whether two calls' arguments are the same: one structure, and tensors of one dtype, shape, device and
    values (other leaves equal, of one type)."""
    left, left_spec = tree_flatten((a.args, dict(a.kwargs)))
    right, right_spec = tree_flatten((b.args, dict(b.kwargs)))
    if left_spec != right_spec:
        return False
    for x, y in zip(left, right, strict=True):
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dtype == y.dtype
                    and x.shape == y.shape and x.device == y.device and torch.equal(x, y)):
                return False
        else:
            try:
                same = type(x) is type(y) and bool(x == y)
            except Exception:  # noqa: BLE001 - a leaf that does not compare to a bool is not known the same
                same = False
            if not same:
                return False
    return True

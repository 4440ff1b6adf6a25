"""Op names: how a Python-level torch call is named in op lists.

Lists use the names the seed documents use: plain function names (`linear`,
`conv2d`, `softmax`, `cross_entropy`), operator names without dunders (`add`,
`mul`, `truediv`, `iadd`) and `__matmul__`. torch.autocast's lists use ATen
names (`cross_entropy_loss`, `conv_transpose2d`); ALIASES lets a Python-level
call match the ATen name it lowers to, so one engine serves both kinds of list.
"""
from __future__ import annotations

import difflib
import functools
import types
from typing import Any, Callable

import torch
import torch.nn.functional as F

# Python-level call name -> other names it is known by in lists (ATen names).
# Note: torch hands a TorchFunctionMode the method behind an operator: `a @ b`
# arrives as `matmul`, `a / b` as `div`, `a += b` as `add_`. The aliases let
# the seeds' operator names (`__matmul__`, `truediv`, `iadd`) still match.
ALIASES: dict[str, tuple[str, ...]] = {
    "matmul": ("__matmul__",),
    "div": ("truediv", "true_divide", "divide"),
    "add_": ("iadd",),
    "sub_": ("isub",),
    "mul_": ("imul",),
    "div_": ("itruediv",),
    "__matmul__": ("matmul",),
    "__rmatmul__": ("matmul",),
    "cross_entropy": ("cross_entropy_loss",),
    "cross_entropy_loss": ("cross_entropy",),
    "nll_loss": ("nll_loss2d", "nll_loss_nd"),
    "nll_loss_nd": ("nll_loss", "nll_loss2d"),
    "truediv": ("true_divide", "div"),
    "true_divide": ("truediv",),
    "divide": ("div",),
    "dropout1d": ("feature_dropout",),
    "dropout2d": ("feature_dropout",),
    "dropout3d": ("feature_dropout",),
    "conv_transpose1d": ("conv_transpose1d",),
}

# Dunder methods keep the seeds' spelling: `__add__` -> `add`, `__iadd__` -> `iadd`.
_KEEP_DUNDER = {"__matmul__", "__rmatmul__"}

# Calls that never compute on float data (metadata, printing, conversions to Python).
SKIP: frozenset[str] = frozenset(
    """__get__ __set__ __len__ __repr__ __format__ __str__ __bool__ __int__ __float__ __index__
    __contains__ __hash__ __iter__ __reduce_ex__ __deepcopy__ __array__ __dlpack__ __dlpack_device__
    __setstate__ __getstate__ __reversed__ __eq__ __ne__ __lt__ __le__ __gt__ __ge__
    size dim numel nelement element_size stride storage_offset is_contiguous is_floating_point
    is_complex item tolist data_ptr untyped_storage storage type_as type to float double half bfloat16
    cpu cuda detach detach_ requires_grad_ retain_grad register_hook backward numpy shape dtype
    device get_device is_set_to has_names names is_same_size is_nonzero clone_ new_empty new_zeros
    new_ones new_full new_tensor empty_like zeros_like ones_like full_like rand_like randn_like
    randint_like _is_view is_leaf grad_fn eq ne lt le gt ge argmax argmin isnan isinf isfinite
    equal allclose isclose all any nonzero""".split()
)


def _raw_name(func: Callable[..., Any]) -> str:
    name = getattr(func, "__name__", None)
    if name is None:  # properties and odd callables
        name = getattr(getattr(func, "fget", None), "__name__", None) or type(func).__name__
    return name


@functools.lru_cache(maxsize=4096)
def _canonical_from_raw(name: str) -> str:
    if name in _KEEP_DUNDER:
        return name
    if name.startswith("__") and name.endswith("__") and len(name) > 4:
        core = name[2:-2]
        if core in ("rdiv", "rtruediv"):
            return "truediv"
        if core.startswith("r") and core[1:] in {"add", "sub", "mul", "truediv", "div", "floordiv", "mod", "pow",
                                                  "and", "or", "xor", "lshift", "rshift"}:
            return core[1:]
        return core
    return name


def canonical_name(func: Callable[..., Any]) -> str:
    """The list name of a torch callable: `Tensor.__iadd__` -> `iadd`, `F.linear` -> `linear`."""
    return _canonical_from_raw(_raw_name(func))


def is_inplace(name: str) -> bool:
    """In-place: `add_`, `iadd`, `imul`... (output and first input share storage)."""
    if name.endswith("_") and not name.startswith("_"):
        return True
    return name in {"iadd", "isub", "imul", "itruediv", "idiv", "ifloordiv", "imod", "ipow", "imatmul",
                    "iand", "ior", "ixor", "ilshift", "irshift", "setitem"}


def lookup_names(name: str) -> tuple[str, ...]:
    """Names to try, in order, when looking `name` up in an op list."""
    return (name, *ALIASES.get(name, ()))


def is_python_composite(func: Callable[..., Any]) -> bool:
    """A torch function written in Python (F.layer_norm, F.multi_head_attention_forward...).

    Unless a list names it, the engine runs its body with interception still on,
    so the builtin ops inside it (linear, bmm...) get their own rules, as under
    torch.autocast, which sees the ATen ops such functions lower to.
    """
    if not isinstance(func, types.FunctionType):
        return False
    filename = func.__code__.co_filename.replace("\\", "/")
    # boolean_dispatch wrappers (max_pool2d...) claim torch.nn.functional but live in _jit_internal: not them.
    return filename.endswith(("torch/nn/functional.py", "torch/functional.py"))


@functools.lru_cache(maxsize=1)
def known_op_names() -> frozenset[str]:
    """Every name an op list may use: torch, Tensor and functional callables plus ATen names."""
    names: set[str] = set()
    for ns in (torch, torch.Tensor, F, torch._C._nn, torch.linalg, torch.fft, torch.special):
        for attr in dir(ns):
            if attr.startswith("_") and not attr.startswith("__"):
                continue
            obj = getattr(ns, attr, None)
            if callable(obj):
                names.add(_canonical_from_raw(getattr(obj, "__name__", attr) or attr))
                names.add(_canonical_from_raw(attr))
    for schema_name in torch._C._dispatch_get_all_op_names():
        if schema_name.startswith("aten::"):
            names.add(schema_name[6:].split(".")[0])
    for name, alts in ALIASES.items():
        names.add(name)
        names.update(alts)
    names.update({"iadd", "isub", "imul", "itruediv", "truediv", "reflection_pad", "replication_pad"})
    return frozenset(n for n in names if n)


def suggest(name: str, n: int = 3) -> list[str]:
    return difflib.get_close_matches(name, sorted(known_op_names()), n=n, cutoff=0.6)

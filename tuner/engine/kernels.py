"""What a matmul-like call's kernel computed in, seen at the ATen level while a recorded forward runs.

The engine decides the dtype an op's inputs are cast to; the kernel torch then picks may compute in another one.
torch's CPU `scaled_dot_product_attention` is the known case: with fewer key/value heads than query heads (a
broadcast), a q/k/v whose last dimension is not contiguous, or dropout, it takes its math fallback, which
widens bf16/fp16 inputs to FP32 and runs both batched matmuls there (issue 40). A report that took the cast for
the computation would claim FLOPs in bf16 that ran in FP32. So, in forwards that record decisions (the report's
shares, the claims, `mpt inspect`, the search's candidates), each matmul/conv-like call (`MATMUL_OPS`,
`RNN_OPS`) runs under `KernelWatch`, which notes the dtypes of the ATen matmul/conv kernels it reaches
(`ATEN_GEMMS`, the ones `tuner.measure.deployed` counts): `Decision.kernel` then says where they differ from
the dtype the call was cast to, on whatever device the fallback happens. Forwards without a recorder (trials,
the loaded model) watch nothing and cost nothing more.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from tuner.policy.opnames import ATEN_GEMMS, MATMUL_OPS, RNN_OPS

WATCHED = MATMUL_OPS | RNN_OPS
_FLOATS = frozenset({torch.float32, torch.float64, torch.bfloat16, torch.float16})


class KernelWatch(TorchDispatchMode):
    """The floating dtypes of the inputs of every ATen matmul/conv kernel run while the mode is on (`dtypes`)."""

    def __init__(self) -> None:
        super().__init__()
        self.dtypes: set[torch.dtype] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.overloadpacket.__name__ in ATEN_GEMMS:
            self.dtypes.update(t.dtype for t in tree_leaves((args, kwargs))
                               if isinstance(t, Tensor) and t.dtype in _FLOATS)
        return out


def kernel_dtype(seen: set[torch.dtype], compute: torch.dtype | None) -> torch.dtype | None:
    """The dtype the kernels computed in when it is not `compute` (the widest, when they ran in several): None
    when they ran in `compute`, or ran no matmul at all (nothing to say)."""
    if not seen or compute is None or seen == {compute}:
        return None
    if len(seen) == 1:
        return next(iter(seen))
    return torch.float64 if torch.float64 in seen else torch.float32

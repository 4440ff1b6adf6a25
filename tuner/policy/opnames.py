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
from collections.abc import Callable
from typing import Any

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
    # torch.gru/rnn_tanh/rnn_relu run their gate matmuls through `linear` below Python, where torch.autocast
    # lowers them (on CPU no fused kernel takes them, unlike lstm's mkldnn_rnn_layer): a list's rule for
    # `linear` is what they get unless it names them.
    "gru": ("linear",),
    "rnn_tanh": ("linear",),
    "rnn_relu": ("linear",),
    # the recurrent cells likewise (AUTOCAST_INSIDE): torch.autocast("cpu") lowers the `linear` calls inside them
    "gru_cell": ("linear",),
    "lstm_cell": ("linear",),
    "rnn_tanh_cell": ("linear",),
    "rnn_relu_cell": ("linear",),
}

# How HMP and the Gaudi bridge name the ops whose names differ from mpt's (`tool_op_name`): HMP's lists name the
# Python functions it wraps (`F.cross_entropy`), Gaudi's the ATen ops torch.autocast registers
# (`cross_entropy_loss`, `feature_dropout` for dropout1d/2d/3d). mpt reads either spelling (ALIASES).
TOOL_NAMES: dict[str, dict[str, str]] = {
    "hmp": {"cross_entropy_loss": "cross_entropy", "nll_loss_nd": "nll_loss", "true_divide": "truediv",
            "__matmul__": "matmul"},
    "gaudi": {"cross_entropy": "cross_entropy_loss", "nll_loss_nd": "nll_loss", "dropout1d": "feature_dropout",
              "dropout2d": "feature_dropout", "dropout3d": "feature_dropout", "__matmul__": "matmul"},
}


def tool_op_name(name: str, tool: str) -> str:
    """`name` as `tool`'s list files spell it ("hmp" or "gaudi"); KeyError for another tool."""
    return TOOL_NAMES[tool].get(name, name)


# ATen composites that torch.autocast never sees whole: a list that does not name them itself gives them the rule of
# the op in ALIASES that they run their matmuls through (`linear`), and torch.autocast lowers only those calls
# inside them, the gate arithmetic running in whatever dtypes the lowered matmuls and the FP32 hidden state give
# (issue 34: nn.GRUCell under torch.autocast("cpu") computes its two addmm in bf16 and returns FP32). Casting every
# input instead would run all of the cell low, which no deployed model does; so the engine runs such a call, when
# its rule lowers it, under torch.autocast itself (`PrecisionEngine`), bit for bit what `tuner.load` runs.
# torch.autocast("cuda") lists the cells themselves (it casts all their inputs), and a list naming them wins.
AUTOCAST_INSIDE: frozenset[str] = frozenset({"gru_cell", "lstm_cell", "rnn_tanh_cell", "rnn_relu_cell"})

# Ops that update buffers they are handed in place (BatchNorm's and InstanceNorm's running statistics). A cast copy
# of such a buffer would take the update and be dropped, the model's own buffer never moving (issue 41: running
# variance 1.0 against 12.2 under HMP's bf16 list). The engine casts only their input: weight, bias and running
# statistics stay as they are (FP32), which torch's kernels take with a bf16/fp16 input on CPU and CUDA (the mixed
# batch norm autocast runs after a lowered conv), and Gaudi autocast's norms do the same.
UPDATES_BUFFERS: frozenset[str] = frozenset({"batch_norm", "instance_norm", "native_batch_norm",
                                             "_native_batch_norm_legit", "cudnn_batch_norm",
                                             "_batch_norm_impl_index", "_batch_norm_with_update"})

# Grouped matrix products: `torch._grouped_mm(a, b, offs=...)` multiplies each group of rows of `a` (delimited by
# `offs`) by its own matrix of `b`, what transformers 5 runs an MoE layer's experts as (`grouped_mm`, its default
# experts implementation), F.grouped_mm being its Python wrapper. torch.autocast lists neither (on CPU nor CUDA):
# mpt's presets name `_grouped_mm` in their lower list and mpt's engine casts it (`tuner.engine.function_mode`).
GROUPED_MM_OPS: frozenset[str] = frozenset({"_grouped_mm"})

# Python-level ops whose work is matrix products or convolutions: their FLOPs make a forward's FLOP share
# (`tuner.measure.flops.op_flops`), and the engine watches the ATen kernels they run (`tuner.engine.kernels`).
MATMUL_OPS = frozenset({"linear", "matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "mv", "dot",
                        "addmm", "baddbmm", "addbmm", "addmv", "einsum", "scaled_dot_product_attention",
                        "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                        "conv_transpose3d", "conv_tbc", "bilinear",
                        # composites that ATen runs as mm/dot calls (issue 34: their FLOPs counted there only)
                        "linalg_matmul", "tensordot", "inner", "linalg_multi_dot", "chain_matmul",
                        # grouped GEMMs: one matmul per group (an MoE layer's experts; issue 44)
                        "grouped_mm", *GROUPED_MM_OPS})
# one step of a recurrent cell: its two gate matmuls (`linear` inside ATen), counted as those
RNN_CELL_OPS = frozenset({"gru_cell", "lstm_cell", "rnn_tanh_cell", "rnn_relu_cell"})
RNN_OPS = frozenset({"lstm", "gru", "rnn_tanh", "rnn_relu", "mkldnn_rnn_layer", "_cudnn_rnn"}) | RNN_CELL_OPS

# ATen ops that multiply matrices or convolve (the work whose precision a plan decides), fused ones included.
# `linear` and `matmul` reach a dispatch mode only on a NestedTensor (whose own kernels they are; on a plain
# tensor they decompose into mm/addmm/bmm first): the layers of an nn.TransformerEncoder that nested its
# padded input, when their fused fast path is off (`tuner.engine.native.install`), run them so (issue 34).
ATEN_GEMMS = frozenset({
    "linear", "matmul",
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "convolution", "_convolution",
    "convolution_overrideable", "mkldnn_convolution", "_mkldnn_linear", "mkldnn_linear", "_addmm_activation",
    "_transformer_encoder_layer_fwd", "_native_multi_head_attention", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_int_mm", "_scaled_mm", "mkldnn_rnn_layer", "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell", "_cudnn_rnn", "conv_tbc", "_trilinear", *GROUPED_MM_OPS,
})

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


# Ops whose compute precision cannot change the numbers: given an input already rounded to the lower
# dtype, computing them in that dtype gives exactly the FP32 result rounded to it (they only move, copy,
# select, reorder or negate values, or compare them with a constant that rounds monotonically). Their
# precision is never worth an FP32 fallback, so they are not tuning candidates, and the ranking passes a
# producer's rounding through them to the op that consumes their output. Names are the ones the engine
# reports (`Decision.op`, see canonical_name). tests/measure/test_ranking.py checks the property for every name.
NEUTRAL_OPS: frozenset[str] = frozenset(
    """view view_as reshape reshape_as flatten unflatten ravel squeeze unsqueeze transpose swapaxes swapdims
    permute movedim moveaxis t contiguous clone detach expand expand_as broadcast_to broadcast_tensors
    as_strided narrow select getitem __getitem__ diagonal unfold split split_with_sizes tensor_split chunk
    unbind hsplit vsplit dsplit cat concat concatenate stack hstack vstack dstack column_stack repeat
    repeat_interleave tile flip fliplr flipud roll rot90 tril triu diag_embed index_select gather take
    take_along_dim masked_select masked_fill where pixel_shuffle pixel_unshuffle channel_shuffle im2col
    pad constant_pad_nd reflection_pad1d reflection_pad2d reflection_pad3d replication_pad1d
    replication_pad2d replication_pad3d upsample_nearest1d upsample_nearest2d upsample_nearest3d
    _upsample_nearest_exact1d _upsample_nearest_exact2d _upsample_nearest_exact3d embedding
    relu relu6 hardtanh clamp clip clamp_min clamp_max neg negative positive abs sign sgn floor ceil trunc fix
    max min amax amin maximum minimum fmax fmin sort msort topk kthvalue median nanmedian cummax cummin
    max_pool1d max_pool2d max_pool3d max_pool1d_with_indices max_pool2d_with_indices max_pool3d_with_indices
    adaptive_max_pool1d adaptive_max_pool2d adaptive_max_pool3d""".split()
)

# torch.distributed's communication, as a sharded model's forward calls it (DTensor redistributions, tensor
# parallel's all-reduces, FSDP2's all-gathers, functional collectives and their waits): they move values between
# ranks, and their precision is the tensors' they are given. Never tuning candidates (keeping one in FP32 would
# keep nothing of the model's compute there); the ranking passes a producer's rounding through them.
COMMUNICATION_OPS: frozenset[str] = frozenset(
    """all_reduce all_reduce_coalesced all_gather all_gather_into_tensor all_gather_into_tensor_coalesced
    all_gather_object reduce_scatter reduce_scatter_tensor reduce_scatter_tensor_coalesced all_to_all
    all_to_all_single broadcast reduce scatter gather_object wait_tensor _wrap_tensor_autograd redistribute
    from_local to_local full_tensor _allgather_base _reduce_scatter_base all_gather_copy_in
    split_with_sizes_copy chunk_cat send recv isend irecv barrier""".split()
)


def is_communication(op: str) -> bool:
    """A collective or DTensor redistribution (COMMUNICATION_OPS), by its name with any overload
    (`_wrap_tensor_autograd.default`) or namespace (`_c10d_functional.all_reduce`) left off."""
    base = op.split(".")
    name = base[1] if len(base) > 1 and base[0].startswith("_c10d") else base[0]
    return name.rstrip("_") in COMMUNICATION_OPS or name in COMMUNICATION_OPS


# Identity when not training (`nn.Dropout` in eval calls F.dropout(x, p, False, inplace), which the engine
# sees as torch.dropout(x, p, False); Dropout1d/2d/3d as feature_dropout).
DROPOUT_OPS: frozenset[str] = frozenset(
    {"dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout", "dropout1d", "dropout2d",
     "dropout3d"})


def is_neutral(op: str, args: tuple = (), kwargs: dict | None = None) -> bool:
    """Whether this call's compute precision cannot change its result (see NEUTRAL_OPS): a shape, copy or
    selection op, or a dropout that is not training. Such a call is no tuning candidate.

    It says nothing about casts: an op in a lower list that receives an FP32 tensor still rounds it
    (`Decision.casts > 0`), which is that call's own doing."""
    if op in NEUTRAL_OPS or is_communication(op):
        return True
    if op in DROPOUT_OPS:
        kwargs = kwargs or {}
        if "training" in kwargs:
            training = kwargs["training"]
        elif "train" in kwargs:
            training = kwargs["train"]
        else:
            training = args[2] if len(args) > 2 else True  # F.dropout's default is training=True
        return training is False or (isinstance(training, (int, float)) and not training)
    return False

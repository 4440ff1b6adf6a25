"""A safetensors file written by mpt, straight from the tensors' own memory and past the page cache.

Why not `safetensors.torch.save_file`: a multi-gigabyte checkpoint written through the page cache costs
seconds of kernel time on a VM (`tuner.core.direct_io` has the figures). This writer streams the same format
through `DirectWriter`: the 8-byte header length, the JSON header (padded with spaces to 8 bytes), then each
tensor's bytes, in safetensors' own order (dtype rank, then name), so safetensors and `tuner.load` read it as
one of theirs. A state dict with a dtype this writer does not know (float8, unsigned) is left to
`save_file`; so is a big-endian machine, where the bytes in memory are not the format's.

The format has no name for complex128 (nor complex32): such a tensor is stored as its real view
(`torch.view_as_real`, a last dimension of 2) and named in the metadata key `AS_REAL_KEY`, so that
`read_safetensors` gives it back bit for bit; a model with a complex128 buffer then tunes, saves and loads
like any other instead of failing in safetensors' writer.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import save_file

from tuner.core.direct_io import DirectWriter

__all__ = ["write_safetensors", "read_safetensors", "stored_form", "encode_header", "FORMAT_DTYPES", "AS_REAL_KEY"]

# name in the file, in safetensors' order: a file lists its tensors by this rank (first first), then by name
FORMAT_DTYPES: dict[torch.dtype, str] = {
    torch.int64: "I64", torch.float64: "F64", torch.complex64: "C64", torch.float32: "F32", torch.int32: "I32",
    torch.bfloat16: "BF16",
    torch.float16: "F16", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
}
_RANK = {dtype: i for i, dtype in enumerate(FORMAT_DTYPES)}
# dtypes the format cannot name -> the real dtype their `view_as_real` has; the file lists such tensors' names
# (a JSON list) under AS_REAL_KEY in its metadata
_AS_REAL: dict[torch.dtype, torch.dtype] = {torch.complex128: torch.float64, torch.complex32: torch.float16}
AS_REAL_KEY = "mpt.as_real"


def stored_form(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None
                ) -> tuple[dict[str, torch.Tensor], dict[str, str] | None]:
    """The tensors and metadata as the file holds them: each tensor of a dtype the format cannot name as its real
    view (no copy), their names under AS_REAL_KEY. Unchanged (the same bytes as before) when there is none."""
    as_real = sorted(name for name, t in tensors.items() if t.dtype in _AS_REAL)
    if not as_real:
        return dict(tensors), dict(metadata) if metadata else None
    stored = dict(tensors) | {name: torch.view_as_real(tensors[name]) for name in as_real}
    return stored, dict(metadata or {}) | {AS_REAL_KEY: json.dumps(as_real)}


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors as they were before `write_safetensors` stored them (complex128 included)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:  # (what load_file does, with the metadata from the same open)
        tensors = {name: fh.get_tensor(name) for name in fh.keys()}
        as_real = json.loads((fh.metadata() or {}).get(AS_REAL_KEY, "[]"))
    for name in as_real:  # (copied: the file's bytes need not sit at the 16-byte alignment complex128 kernels assume)
        tensors[name] = torch.view_as_complex(tensors[name].clone())
    return tensors


def encode_header(head: Mapping[str, object]) -> bytes:
    """A safetensors header as the file holds it: compact JSON, padded with spaces to a multiple of 8 bytes
    (safetensors' own padding; the data after it stays aligned)."""
    raw = json.dumps(head, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)


def _header(tensors: Mapping[str, torch.Tensor], order: list[str], metadata: Mapping[str, str] | None) -> bytes:
    head: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    at = 0
    for name in order:
        t = tensors[name]
        size = t.numel() * t.element_size()
        head[name] = {"dtype": FORMAT_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [at, at + size]}
        at += size
    return encode_header(head)


def write_safetensors(tensors: Mapping[str, torch.Tensor], path: str | Path,
                      metadata: Mapping[str, str] | None = None) -> None:
    """Write `tensors` to `path` as safetensors (tensors sharing memory are written once per name); read it back
    with `read_safetensors` (safetensors' own readers give a complex128 tensor as its real view)."""
    tensors, metadata = stored_form(tensors, metadata)
    if sys.byteorder != "little" or any(t.dtype not in FORMAT_DTYPES for t in tensors.values()):
        save_file(dict(tensors), str(path), metadata=dict(metadata) if metadata else None)
        return
    order = sorted(tensors, key=lambda name: (_RANK[tensors[name].dtype], name))
    header = _header(tensors, order, metadata)
    with DirectWriter(path) as out:
        out.write(len(header).to_bytes(8, "little"))
        out.write(header)
        for name in order:
            t = tensors[name].detach()
            if t.numel():  # (a tensor off the CPU or not contiguous is copied: the checkpoint passes neither)
                out.write(t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy())

"""A safetensors file written by mpt, straight from the tensors' own memory and past the page cache.

Why not `safetensors.torch.save_file`: a multi-gigabyte checkpoint written through the page cache costs
seconds of kernel time on a VM (`tuner.core.direct_io` has the figures). This writer streams the same format
through `DirectWriter`: the 8-byte header length, the JSON header (padded with spaces to 8 bytes), then each
tensor's bytes, in safetensors' own order (dtype rank, then name), so safetensors and `tuner.load` read it as
one of theirs. A state dict with a dtype this writer does not know (float8, unsigned) is left to
`save_file`; so is a big-endian machine, where the bytes in memory are not the format's.

The file is hashed as it is written (`Written.sha256`, the digest plan.yaml records): no second read of
gigabytes to learn it. What is hashed is each tensor's bytes as the writer takes them from the tensor, in a
thread beside the copy and the write, so a byte changed on its way to the disk makes the file's digest differ
from the recorded one, which every `tuner.load` compares.

Tensors off the CPU (a GPU's) come to the host in groups of up to `GROUP_BYTES`, one copy per group (one
device-to-host transfer, one synchronization), not one per tensor: a checkpoint of hundreds of tensors costs
a few transfers.

The format has no name for complex128 (nor complex32): such a tensor is stored as its real view
(`torch.view_as_real`, a last dimension of 2) and named in the metadata key `AS_REAL_KEY`, so that
`read_safetensors` gives it back bit for bit; a model with a complex128 buffer then tunes, saves and loads
like any other instead of failing in safetensors' writer.
"""
from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from tuner.core.direct_io import DirectWriter
from tuner.core.fingerprint import sha256_file

__all__ = ["write_safetensors", "read_safetensors", "stored_form", "encode_header", "FORMAT_DTYPES", "AS_REAL_KEY",
           "Written", "GROUP_BYTES"]

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


GROUP_BYTES = 1 << 26  # tensors off the CPU come to the host this many bytes at a time (one transfer each)


@dataclass(frozen=True)
class Written:
    """What `write_safetensors` wrote: the sha256 of the bytes it handed to the file, and how many."""

    sha256: str
    size: int

    def __post_init__(self) -> None:
        if self.size < 0 or len(self.sha256) != 64:
            raise ValueError(f"written: a sha256 (64 hex digits) and a size >= 0, found {self}")


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _host_bytes(tensors: list[torch.Tensor], grouped: bool) -> Iterator[np.ndarray]:
    """Each tensor's bytes on the host, in order: a CPU tensor's own memory (no copy), the others' copied in
    groups of consecutive tensors on one device, up to GROUP_BYTES each (a larger tensor alone), one transfer
    per group. `grouped`: every tensor goes through the groups, as a GPU's do (the CPU suite runs that path)."""
    group: list[torch.Tensor] = []
    size = 0

    def flush() -> Iterator[np.ndarray]:
        nonlocal size
        if group:
            host = (torch.cat(group) if len(group) > 1 else group[0]).cpu().numpy()
            at = 0
            for part in group:
                yield host[at:at + part.numel()]
                at += part.numel()
            group.clear()
            size = 0

    for t in tensors:
        flat = _flat(t)
        if t.device.type == "cpu" and not grouped:
            yield from flush()
            yield flat.numpy()
            continue
        if group and (group[0].device != flat.device or size + flat.numel() > GROUP_BYTES):
            yield from flush()
        group.append(flat)
        size += flat.numel()
    yield from flush()


def _distinct(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors on the host, each one whose bytes overlap a tensor already taken (a tied weight's second
    name) copied: safetensors' own writer refuses tensors that share memory (ours writes each name's bytes)."""
    out: dict[str, torch.Tensor] = {}
    spans: dict[int, list[tuple[int, int]]] = {}
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        if t.numel():
            start = t.data_ptr()
            end = start + t.numel() * t.element_size()
            taken = spans.setdefault(t.untyped_storage().data_ptr(), [])
            if any(start < e and s < end for s, e in taken):
                t = t.clone()
            else:
                taken.append((start, end))
        out[name] = t
    return out


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
                      metadata: Mapping[str, str] | None = None, *, grouped: bool = False) -> Written:
    """Write `tensors` to `path` as safetensors (tensors sharing memory are written once per name); read it back
    with `read_safetensors` (safetensors' own readers give a complex128 tensor as its real view). Returns the
    file's sha256 and size, hashed as written (module docstring). `grouped`: see `_host_bytes`."""
    tensors, metadata = stored_form(tensors, metadata)
    if sys.byteorder != "little" or any(t.dtype not in FORMAT_DTYPES for t in tensors.values()):
        save_file(_distinct(tensors), str(path), metadata=dict(metadata) if metadata else None)
        return Written(sha256_file(path), Path(path).stat().st_size)  # (no writer of ours: read to hash it)
    order = sorted(tensors, key=lambda name: (_RANK[tensors[name].dtype], name))
    header = _header(tensors, order, metadata)
    digest = hashlib.sha256()
    head = len(header).to_bytes(8, "little") + header
    digest.update(head)
    pending: Future[None] | None = None
    with DirectWriter(path) as out, ThreadPoolExecutor(max_workers=1, thread_name_prefix="mpt-hash") as pool:
        out.write(head)
        for data in _host_bytes([tensors[name] for name in order if tensors[name].numel()], grouped):
            if pending is not None:
                pending.result()
            pending = pool.submit(digest.update, data.data)  # hashed beside the copy into the file (both free the GIL)
            out.write(data)
        if pending is not None:
            pending.result()
    return Written(digest.hexdigest(), out.written)

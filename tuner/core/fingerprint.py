"""Fingerprints: what a journal or plan was made for, so a mismatch is caught instead of reused.

- `source_digest`: the bytes of the user's files (model file, eval/inputs files, the user's files they
  import); `file_digests` the same per file, to say which one changed.
- `structure_digest`: module paths and classes, parameter/buffer names and shapes.
  Dtypes are left out on purpose: a loaded checkpoint stores some weights in
  bf16 and must still match the FP32 model it was tuned on.
- `tensor_checksums`: a fast, non-cryptographic sum over every byte of every
  tensor, position-weighted per block, reduced by torch where the tensor lives
  (GPU memory bandwidth on a GPU; tens of GB/s on a CPU): no weight byte is
  copied to the host, only 8 bytes per tensor come back.
- `weights_digest`: sha256 over every tensor's name, dtype, shape and checksum:
  what a journal or plan records of the weights it was made for.
- `ModelState`: a cheap record of a model's object graph (module and tensor
  identities, version counters, training flags, hooks) plus its weights
  checksum, to tell whether `evaluate` changed the model. Taken after every
  evaluation, so it must cost little next to one: on a 1.1B-parameter model a
  sha256 takes about 4 s, the checksum a fraction of a second.
"""
from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from tuner.core.sharding import class_name, is_dtensor, local_tensor, placements

_BLOCK = 1 << 13  # 64-bit words per block of the checksum: a change that moves data between blocks shows
_MASK = (1 << 64) - 1


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tree_sha256(path: str | Path) -> str:
    """sha256 of a file, or of a folder's files (their relative names and sha256s, sorted): a sharded
    checkpoint is a folder of files, one or more per rank."""
    root = Path(path)
    if not root.is_dir():
        return sha256_file(root)
    h = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(f"{file.relative_to(root).as_posix()} {sha256_file(file)}\n".encode())
    return h.hexdigest()


def source_digest(paths: Iterable[str | Path]) -> str:
    """sha256 over the contents of the user's files (in a stable order)."""
    h = hashlib.sha256()
    for path in sorted({str(Path(p).resolve()) for p in paths}):
        h.update(Path(path).name.encode() + b"\0")
        h.update(bytes.fromhex(sha256_file(path)))
    return h.hexdigest()


def file_digests(paths: Iterable[str | Path], *, base: str | Path) -> dict[str, str]:
    """name -> sha256 of each file, in the order given; a name is the path relative to `base` where the
    file lies under it (the model file's folder), else the full path. Says which file changed."""
    found: dict[str, str] = {}
    root = Path(base).resolve()
    for p in paths:
        path = Path(p).resolve()
        try:
            name = path.relative_to(root).as_posix()
        except ValueError:
            name = str(path)
        found.setdefault(name, sha256_file(path))
    return found


def structure_digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, module in model.named_modules():
        h.update(f"m {name} {class_name(module)}\n".encode())
    for name, t in model.state_dict(keep_vars=True).items():
        h.update(f"t {name} {tuple(t.shape)}\n".encode())
    return h.hexdigest()


def weights_digest(model: nn.Module, checksums: Checksums | None = None) -> str:
    """A digest of the state dict: sha256 over every tensor's name, dtype, shape and `tensor_checksums`
    checksum (every byte of it, summed where the tensor lives). It identifies the weights a journal or plan
    was made for without copying them off their device (issue 33: on a GPU, 9,000 copies to the host and a
    host-side hash were a fifth of a tune). A sharded model's is every rank's digest of its own shards (with
    their placements) combined over the mesh, in rank order: a collective, the same value on every rank.
    `checksums`: `tensor_checksums(model)` as taken earlier (the model keeper's capture of the model as built),
    so no byte is read again; the names, dtypes and shapes are then theirs, the placements the model's."""
    h = hashlib.sha256(b"mpt-weights-2\n")
    sharded = None
    state = {name: t for name, t in model.state_dict(keep_vars=True).items() if isinstance(t, torch.Tensor)}
    for name, dtype, shape, checksum in tensor_checksums(model) if checksums is None else checksums:
        where = ""
        t = state.get(name)
        if t is not None and is_dtensor(t):
            sharded, where = t, f" {placements(t)}"
        h.update(f"{name} {dtype} {shape}{where} {checksum}\n".encode())
    if sharded is None:
        return h.hexdigest()
    import torch.distributed as dist

    found: list[str | None] = [None] * sharded.device_mesh.size()  # type: ignore[attr-defined]
    dist.all_gather_object(found, h.hexdigest(), group=sharded.device_mesh.get_group())  # type: ignore[attr-defined]
    return hashlib.sha256(" ".join(str(d) for d in found).encode()).hexdigest()


def _tensor_checksum(t: torch.Tensor) -> torch.Tensor | int:
    """Sum of the tensor's 64-bit words plus each block's sum weighted by its position, plus its trailing
    bytes (all modulo 2**64: torch's int64 sums wrap), computed by torch where the tensor lives: a 0-d tensor
    on its device (0 for a tensor with no bytes). No byte is copied to the host."""
    t = local_tensor(t.detach())
    if t.device.type == "meta" or t.numel() == 0:
        return 0
    flat = (t if t.is_contiguous() else t.contiguous()).reshape(-1).view(torch.uint8)
    whole = flat.numel() - flat.numel() % 8
    try:
        words = flat[:whole].view(torch.int64)
    except RuntimeError:  # a view whose offset is not 8-byte aligned: its own copy is
        words = flat[:whole].clone().view(torch.int64)
    full = words.numel() - words.numel() % _BLOCK
    blocks = words[:full].view(-1, _BLOCK).sum(dim=1)
    rest = words[full:].sum() + flat[whole:].to(torch.int64).sum()
    weights = torch.arange(1, blocks.numel() + 1, dtype=torch.int64, device=blocks.device)
    return blocks.sum() + (blocks * weights).sum() + (blocks.numel() + 1) * rest


def tensor_checksum(t: torch.Tensor) -> int:
    """`tensor_checksums`' checksum of one tensor, as a Python int (one sync where the tensor lives)."""
    return _on_host([_tensor_checksum(t)])[0] & _MASK


def weights_checksum(model: nn.Module) -> str:
    """A fast checksum of the model's state dict (names, dtypes, shapes, every byte); see the module docstring."""
    h = hashlib.sha256()
    for name, dtype, shape, checksum in tensor_checksums(model):
        h.update(f"{name} {dtype} {shape} {checksum}\n".encode())
    return h.hexdigest()


Checksums = tuple[tuple[str, torch.dtype, tuple[int, ...], int], ...]


def tensor_checksums(model: nn.Module, *, since: Checksums | None = None,
                     changed: Collection[torch.Tensor] = (), known: Mapping[int, int] | None = None) -> Checksums:
    """(name, dtype, shape, checksum) of every tensor of the state dict. With `since` (this model's checksums
    at an earlier look), only the tensors in `changed` (by identity) and the entries that do not line up are
    read again: the caller knows that nothing else was touched in between. `known`: id(tensor) -> its
    checksum, taken by the caller of the bytes it holds now (a lowered copy's: `held.HeldLowered`), not read.

    The checksums are reduced on each tensor's device and come to the host together, one small tensor per
    device (`_on_host`): a model on a GPU costs a few kernel launches per tensor and one copy of 8 bytes
    per tensor, never a copy of its weights."""
    ids = {id(t) for t in changed}
    old = {} if since is None else {entry[0]: entry for entry in since}
    out: list[tuple[str, torch.dtype, tuple[int, ...], torch.Tensor | int]] = []
    for name, t in model.state_dict(keep_vars=True).items():
        if not isinstance(t, torch.Tensor):
            continue
        before = old.get(name)
        if before is not None and id(t) not in ids and before[1:3] == (t.dtype, tuple(t.shape)):
            out.append(before)
        elif known is not None and id(t) in known:
            out.append((name, t.dtype, tuple(t.shape), known[id(t)]))
        else:
            out.append((name, t.dtype, tuple(t.shape), _tensor_checksum(t)))
    values = _on_host([entry[3] for entry in out])
    return tuple((name, dtype, shape, value & _MASK)
                 for (name, dtype, shape, _), value in zip(out, values, strict=True))


def _on_host(values: list[torch.Tensor | int]) -> list[int]:
    """Python ints of `values` (0-d tensors on any devices, or ints): one transfer per device."""
    found: list[int] = [v if isinstance(v, int) else 0 for v in values]
    by_device: dict[torch.device, list[int]] = {}
    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor):
            by_device.setdefault(v.device, []).append(i)
    for places in by_device.values():
        for i, value in zip(places, torch.stack([values[i] for i in places]).tolist(), strict=True):  # type: ignore[misc]
            found[i] = int(value)
    return found


def _object_graph(model: nn.Module) -> tuple:
    """Identities and flags that change when code rebinds, swaps or retrains parts of the model."""
    items: list[tuple] = []
    for name, module in model.named_modules(remove_duplicate=False):
        items.append((name, id(module), type(module), module.training, "forward" in module.__dict__,
                      len(module._forward_hooks), len(module._forward_pre_hooks)))
    for name, t in model.state_dict(keep_vars=True).items():
        if isinstance(t, torch.Tensor):
            own = local_tensor(t)
            items.append((name, id(t), own.data_ptr() if t.device.type != "meta" else 0, own._version,
                          t.dtype, tuple(t.shape), t.device, t.requires_grad))
    return tuple(items)


@dataclass(frozen=True)
class ModelState:
    """The model as it is now: compare two with == to learn whether anything changed."""

    graph: tuple
    weights: Checksums

    @staticmethod
    def identities(model: nn.Module) -> tuple:
        """The cheap part of a capture (`graph`: identities, addresses, version counters, flags; no byte read),
        to compare with a capture's `graph` after a block that only ran a forward."""
        return _object_graph(model)

    @classmethod
    def capture(cls, model: nn.Module, *, since: ModelState | None = None,
                changed: Collection[torch.Tensor] = (), known: Mapping[int, int] | None = None) -> ModelState:
        """`since`: the model's state at an earlier look, where only `changed` tensors were written after it
        (mpt's own lowering, `tuner.measure.held`): their bytes alone are read again, but for those whose
        checksums are `known` (`tensor_checksums`)."""
        return cls(_object_graph(model), tensor_checksums(model, since=None if since is None else since.weights,
                                                              changed=changed, known=known))

"""A sharded model's checkpoint: `torch.distributed.checkpoint` (DCP), each rank writing its own shards.

`save_shards` is collective (every rank calls it, with the same arguments): the
model's state dict, its DTensors as they lie on each rank, with the parameters
the plan lowers (`lowered`, matched by name) converted to their lower dtype,
goes into `model.dcp/` under a folder rank 0 made; with `consolidate`, every
rank also gathers the full tensors and rank 0 writes them as `model.safetensors`
(what `tuner.load` loads into an unsharded model; gathering holds each full
tensor on every rank for a moment, one at a time). Rank 0's writer then commits
them with the other outputs (`SavedShards.move_into`); `plan.yaml` records
`checkpoint_digest` of the two.

Loading (`load_shards`): into a sharded model, DCP reads each rank's shards
into the model's own FP32 DTensors (a bf16 value widened to FP32 is exact, and
the plan's cast at each use gives back the very bf16 the trials used); into an
unsharded model, the consolidated file when there is one, else DCP reads the
shards into the whole tensors in one process.
"""
from __future__ import annotations

import hashlib
import shutil
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from tuner.core.errors import PlanMismatchError
from tuner.core.fileio import atomic_write
from tuner.core.fingerprint import tree_sha256
from tuner.core.output_files import CHECKPOINT_NAME, SHARDED_CHECKPOINT_NAME
from tuner.core.safetensors_write import write_safetensors
from tuner.core.sharding import Sharding, is_dtensor, local_tensor


@dataclass(frozen=True)
class SavedShards:
    """The checkpoint every rank wrote into `folder` (rank 0's): model.dcp/ and, consolidated, model.safetensors."""

    folder: Path
    lowered: int  # parameters stored in the lower dtype
    bytes: int  # the DCP folder's size
    fp32_bytes: int  # the state dict's size with every floating-point tensor in FP32

    def move_into(self, stage: Path) -> str:
        """Move the checkpoint into the writer's `stage`; its digest for plan.yaml."""
        for name in (SHARDED_CHECKPOINT_NAME, CHECKPOINT_NAME):
            if (self.folder / name).exists():
                shutil.move(str(self.folder / name), str(stage / name))
        return checkpoint_digest(stage)


def checkpoint_digest(folder: Path) -> str:
    """The digest plan.yaml records for a sharded checkpoint: its DCP folder's and the consolidated file's."""
    parts = [tree_sha256(folder / SHARDED_CHECKPOINT_NAME)]
    if (folder / CHECKPOINT_NAME).is_file():
        parts.append(tree_sha256(folder / CHECKPOINT_NAME))
    return parts[0] if len(parts) == 1 else hashlib.sha256(" ".join(parts).encode()).hexdigest()


def _lowered_state(model: nn.Module, lowered: Mapping[str, torch.dtype]) -> dict[str, Tensor]:
    return {name: t.detach().to(lowered[name]) if name in lowered else t.detach()
            for name, t in model.state_dict().items() if isinstance(t, Tensor)}


def save_shards(model: nn.Module, lowered: Mapping[str, torch.dtype], folder: Path, *, consolidate: bool,
                main: bool) -> SavedShards:
    """Write the sharded checkpoint into `folder` (collective; see the module docstring). `main`: rank 0."""
    import torch.distributed.checkpoint as dcp

    state = _lowered_state(model, lowered)
    dcp.save(state, checkpoint_id=str(folder / SHARDED_CHECKPOINT_NAME))
    fp32_bytes = sum(t.numel() * (4 if t.is_floating_point() else t.element_size())
                     for t in model.state_dict().values() if isinstance(t, Tensor))
    if consolidate:
        full = {name: (t.full_tensor() if is_dtensor(t) else t).contiguous().cpu()  # type: ignore[attr-defined]
                for name, t in state.items()}
        if main:
            atomic_write(folder / CHECKPOINT_NAME, lambda tmp: write_safetensors(full, tmp, metadata={"format": "pt"}))
        del full
    size = sum(f.stat().st_size for f in (folder / SHARDED_CHECKPOINT_NAME).rglob("*") if f.is_file())
    return SavedShards(folder, lowered=len(lowered), bytes=size, fp32_bytes=fp32_bytes)


def load_shards(model: nn.Module, folder: Path) -> None:
    """The DCP checkpoint in `folder` into `model`, sharded or not (see the module docstring)."""
    import torch.distributed.checkpoint as dcp

    state = model.state_dict()
    alone = not Sharding.of(model).sharded
    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(state, checkpoint_id=str(folder / SHARDED_CHECKPOINT_NAME), no_dist=alone)
    except Exception as exc:  # noqa: BLE001 - DCP's CheckpointException wraps each rank's error
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise PlanMismatchError(f"{folder / SHARDED_CHECKPOINT_NAME} does not load into this model: {first}") from None
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if isinstance(t, Tensor) and name in state and state[name] is not t:
                local_tensor(t).copy_(local_tensor(state[name]))


def load_whole(model: nn.Module, tensors: Mapping[str, Tensor]) -> None:
    """Whole tensors (an unsharded run's model.safetensors) into a sharded model: each rank copies its own
    slice into its FP32 shards (every rank reads the same file; no communication)."""
    from torch.distributed.tensor import distribute_tensor

    with torch.no_grad():
        for name, t in model.state_dict().items():
            if not isinstance(t, Tensor) or name not in tensors:
                continue
            whole = tensors[name].to(t.dtype)
            if is_dtensor(t):
                mine = distribute_tensor(whole, t.device_mesh, t.placements, src_data_rank=None)  # type: ignore[attr-defined]
                local_tensor(t).copy_(local_tensor(mine))
            else:
                t.copy_(whole)

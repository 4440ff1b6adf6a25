"""Models sharded over ranks (FSDP2's `fully_shard`, tensor parallelism): what mpt needs to know of them.

A sharded model holds DTensor parameters: each rank holds its local shard, and
the model's forward is collective (FSDP all-gathers, TP all-reduces), so every
rank must run every forward together. mpt reads a model's sharding here, once:

- `Sharding.of(model)`: whether it is sharded, over which 1-D mesh; a model mpt
  cannot run (a 2-D mesh, a mesh that is not every rank, pipeline stages) is a
  ConfigError with one line.
- `local_tensor`: a tensor's own bytes (a DTensor's local shard), for fingerprints.
- `class_name`: a module's class as the user wrote it (`fully_shard` swaps a
  module's class for a generated `FSDP<Name>` subclass), so a plan made on a
  sharded model names the same classes as the unsharded one.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tuner.core.errors import ConfigError


def _loaded(module: str, name: str) -> Any:
    """`module.name` if the module is already imported, else None, never importing it: a DTensor or an
    FSDP-sharded module exists only once its class's module was imported (by the user's code), and importing
    torch.distributed's FSDP and DTensor packages costs about a second of every mpt command's start. (Never
    an import inside a dispatch mode that asks `is_dtensor`, either.)"""
    found = sys.modules.get(module)
    return getattr(found, name, None) if found is not None else None


def _dtensor_class() -> Any:
    return _loaded("torch.distributed.tensor", "DTensor")


def _fsdp_class() -> Any:
    return _loaded("torch.distributed.fsdp", "FSDPModule")


def is_dtensor(t: object) -> bool:
    """Whether `t` is a torch.distributed DTensor."""
    cls = _dtensor_class()
    return cls is not None and isinstance(t, cls)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The tensor's own data on this rank: a DTensor's local shard (numpy cannot read a tensor subclass)."""
    return t.to_local() if is_dtensor(t) else t  # type: ignore[attr-defined]


def placements(t: torch.Tensor) -> str:
    """A DTensor's placements as text ("Shard(dim=0)"), "" for a plain tensor: part of its fingerprint."""
    return ",".join(str(p) for p in t.placements) if is_dtensor(t) else ""  # type: ignore[attr-defined]


def class_name(module: nn.Module) -> str:
    """The module's class qualname as written: `fully_shard`'s generated `FSDP<Name>` class is skipped."""
    cls, fsdp = type(module), _fsdp_class()
    if fsdp is not None and isinstance(module, fsdp):
        for base in cls.__mro__[1:]:
            if base is not fsdp and not issubclass(base, fsdp):
                return base.__qualname__
    return cls.__qualname__


def _tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [(n, t) for n, t in [*model.named_parameters(), *model.named_buffers()] if isinstance(t, torch.Tensor)]


@dataclass(frozen=True)
class Sharding:
    """How a model is spread over the ranks: `mesh_size` ranks (0: not sharded), `kinds` ("fsdp", "tp")."""

    mesh_size: int = 0
    kinds: tuple[str, ...] = ()
    group: Any = None  # the mesh's process group (None: not sharded)

    @property
    def sharded(self) -> bool:
        return self.mesh_size > 0

    def describe(self) -> str:
        return f"{'+'.join(self.kinds)} over {self.mesh_size} ranks" if self.sharded else "not sharded"

    @classmethod
    def of(cls, model: nn.Module) -> Sharding:
        """The model's sharding; ConfigError (one line) for a layout mpt cannot run."""
        _refuse_pipeline(model)
        meshes: dict[tuple, tuple[str, Any]] = {}  # by what a mesh is (its ranks): equal meshes may be two objects
        for n, t in _tensors(model):
            if is_dtensor(t):
                mesh = t.device_mesh  # type: ignore[attr-defined]
                meshes.setdefault((mesh.device_type, tuple(mesh.mesh.shape), tuple(mesh.mesh.flatten().tolist())),
                                  (n, mesh))
        if not meshes:
            return cls()
        if len(meshes) > 1:
            names = ", ".join(n for n, _ in list(meshes.values())[:2])
            raise ConfigError(f"the model's parameters lie on {len(meshes)} different device meshes ({names}, ...): "
                              "mpt tunes models sharded over one 1-D mesh of every rank")
        name, mesh = next(iter(meshes.values()))
        import torch.distributed as dist

        if mesh.ndim != 1:
            raise ConfigError(f"parameter {name} lies on a {mesh.ndim}-D device mesh {tuple(mesh.shape)}: mpt tunes "
                              "models sharded over one 1-D mesh of every rank (FSDP2 or tensor parallel, not both "
                              "over a 2-D mesh)")
        world = dist.get_world_size() if dist.is_initialized() else 1
        if mesh.size() != world:
            raise ConfigError(f"parameter {name} lies on a device mesh of {mesh.size()} ranks but the run has "
                              f"{world}: the mesh must span every rank (init_device_mesh(device, (world_size,)))")
        return cls(mesh.size(), _kinds(model), mesh.get_group())


def is_fsdp(model: nn.Module) -> bool:
    """Whether any module of `model` is sharded with FSDP2's fully_shard."""
    fsdp = _fsdp_class()
    return fsdp is not None and any(isinstance(m, fsdp) for m in model.modules())


def _kinds(model: nn.Module) -> tuple[str, ...]:
    return ("fsdp",) if is_fsdp(model) else ("tp",)


def _refuse_pipeline(model: nn.Module) -> None:
    """Pipeline parallelism splits the model into stages on different ranks: no rank runs the whole forward.
    (A stage object exists only where torch.distributed.pipelining was imported: it is not imported for this,
    which would cost a second of every tune.)"""
    staged = False
    if "torch.distributed.pipelining" in sys.modules:
        from torch.distributed.pipelining import PipelineStage
        from torch.distributed.pipelining.stage import _PipelineStageBase
        staged = isinstance(model, (PipelineStage, _PipelineStageBase))
    if staged or any("pipelining" in type(m).__module__ for m in model.modules()):
        raise ConfigError("build_model() returned a pipeline-parallel model (torch.distributed.pipelining): mpt "
                          "runs the whole forward on every rank; shard it with FSDP2 or tensor parallelism instead")

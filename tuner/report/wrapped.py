"""A tuned folder loaded into the model one level in or out of the one that was tuned.

`mpt tune hf:DIR` on a sentence-transformers folder tunes mpt's wrapper `SentenceEncoder`, whose parameters
are named `model.0.model.embeddings...`; the user holds the `SentenceTransformer` (named `0.model....`) or
the transformer inside it (`AutoModel.from_pretrained(DIR)`: `embeddings...`). Without sentence-transformers
installed, the same folder was tuned as that bare transformer, and the user may load it into the
SentenceTransformer. The weights and the op decisions are the same in each case, only under names one
module path longer or shorter, so `tuner.load` renames them instead of refusing the user's own object.

`Rename` is found from names and shapes alone: the model must be exactly one submodule of the tuned model
(every tensor of its state dict found under one prefix with the same shape), or the tuned model exactly one
submodule of it. The plan is then rebased onto the model: instances and module overrides under the prefix
keep their place, those outside it (a pooling module the user's transformer lacks) are dropped, since those
modules are not the user's model.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from safetensors import SafetensorError, safe_open
from torch import Tensor, nn

from tuner.policy.plan import OpInstance, Plan


@dataclass(frozen=True)
class Rename:
    """Checkpoint name = `strip` + model name less `add`: one of the two is a module path prefix ("a.b."),
    the other empty. `strip`: the tuned model wrapped the user's; `add`: the user's wraps the tuned one."""

    strip: str = ""
    add: str = ""

    def __post_init__(self) -> None:
        if bool(self.strip) == bool(self.add) or not (self.strip or self.add).endswith("."):
            raise ValueError(f"a rename has one module path prefix ending in '.', found {self}")

    def model_name(self, checkpoint_name: str) -> str | None:
        """The model's name for a checkpoint (or plan) name; None when it lies outside the model."""
        if not checkpoint_name.startswith(self.strip):
            return None
        return self.add + checkpoint_name[len(self.strip):]

    def module_path(self, path: str) -> str | None:
        """A plan's module path (or glob) on the model; None for a module outside it. The tuned root is
        `add` less its dot; a glob that starts with `*` matches anywhere and is kept as it is."""
        if path.startswith("*"):
            return path
        if path == self.strip[:-1]:
            return self.add[:-1]
        return self.model_name(path)

    def tensors(self, tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """The checkpoint's tensors under the model's names (those outside the model left out)."""
        named = ((self.model_name(k), t) for k, t in tensors.items())
        return {k: t for k, t in named if k is not None}

    def plan(self, plan: Plan) -> Plan:
        """`plan` on the model: paths renamed, those outside it dropped. The recorded structure digest is
        left out: it is the tuned model's (the checkpoint's names and shapes are checked against the model)."""
        instances, others = self._instances(plan.fp32_instances), self._instances(plan.fallback_instances)
        modules = [(p, d) for p, d in ((self.module_path(p), d) for p, d in plan.modules) if p is not None]
        model = None if plan.model is None else dataclasses.replace(plan.model, structure="")
        return dataclasses.replace(plan, fp32_instances=instances, fallback_instances=others, modules=tuple(modules),
                                   model=model)

    def _instances(self, instances: tuple[OpInstance, ...]) -> tuple[OpInstance, ...]:
        """`instances` on the model: paths renamed, those outside it dropped."""
        found = ((self.module_path(i.module), i) for i in instances)
        return tuple(OpInstance(path, i.op, i.index) for path, i in found if path is not None)


def checkpoint_shapes(path: Path) -> dict[str, tuple[int, ...]] | None:
    """name -> shape of a safetensors file, from its header alone; None when it cannot be read (the load
    that follows says why)."""
    try:
        with safe_open(str(path), framework="pt") as fh:
            return {k: tuple(fh.get_slice(k).get_shape()) for k in fh.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError):
        return None


def find_rename(model: nn.Module, checkpoint: Mapping[str, tuple[int, ...]]) -> Rename | None:
    """How `model`'s names map onto the checkpoint's when it is one submodule of the tuned model, or the
    tuned model one submodule of it; None when the names already agree, or no prefix makes them agree."""
    mine = {k: tuple(t.shape) for k, t in model.state_dict().items()}
    if not mine or not checkpoint or set(mine) == set(checkpoint):
        return None
    for rename in _candidates(mine, checkpoint):
        ours = {rename.model_name(k): s for k, s in checkpoint.items()}
        ours.pop(None, None)
        if ours == mine:
            return rename
    return None


def _candidates(mine: Mapping[str, tuple[int, ...]], theirs: Collection[str]) -> list[Rename]:
    """The prefixes that could make one name set the other's: from where one model's first name sits in the
    other's names (a state dict lists the root's own tensors and submodules in a fixed order)."""
    found: list[Rename] = []
    first = next(iter(mine))
    for name in theirs:
        if name.endswith("." + first):
            found.append(Rename(strip=name[:-len(first)]))
    first_theirs = next(iter(theirs))
    for name in mine:
        if name.endswith("." + first_theirs):
            found.append(Rename(add=name[:-len(first_theirs)]))
    return found

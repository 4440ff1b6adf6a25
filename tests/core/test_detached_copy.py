"""detached_copy: what mpt keeps to compare with cannot be changed by what is done to the original later."""
from __future__ import annotations

from collections import OrderedDict, namedtuple
from dataclasses import dataclass, field

import torch

from tuner.core.inputs import detached_copy, float_leaves


@dataclass(frozen=True)
class Frozen:
    hidden: torch.Tensor
    extra: list = field(default_factory=list)


class Custom:
    pass


@dataclass
class OwnInit:
    value: torch.Tensor

    def __init__(self, scale: float) -> None:  # not built from its fields: copied field by field
        self.value = torch.full((2,), scale)


Pair = namedtuple("Pair", "a b")


def test_every_tensor_is_cloned_and_every_container_rebuilt():
    t = torch.ones(3, requires_grad=True)
    out = {"x": t, "list": [t * 2, (t * 3, Pair(t * 4, 5))], "od": OrderedDict(y=t * 5),
           "frozen": Frozen(t * 6, [t * 7]), "own": OwnInit(8.0), "obj": Custom()}
    kept = detached_copy(out)
    assert kept is not out and type(kept["od"]) is OrderedDict and isinstance(kept["list"][1][1], Pair)
    assert isinstance(kept["frozen"], Frozen) and kept["frozen"] is not out["frozen"]
    assert kept["own"] is not out["own"] and kept["obj"] is out["obj"]  # a non-container is kept as it is
    before = [x.detach().clone() for x in float_leaves(out)]
    with torch.no_grad():
        for leaf in float_leaves(out):
            leaf.add_(100.0)  # in place, through every alias
    out["x"] = torch.zeros(3)  # the container itself rewritten
    out["list"].append(torch.zeros(1))
    assert all(torch.equal(a, b) for a, b in zip(float_leaves(kept), before, strict=True))
    assert not any(x.requires_grad for x in float_leaves(kept))


def test_a_shared_container_is_copied_once_and_a_cycle_ends():
    inner = [torch.ones(2)]
    out = {"a": inner, "b": inner}
    kept = detached_copy(out)
    assert kept["a"] is kept["b"] and len(float_leaves(kept)) == len(float_leaves(out)) == 1
    loop: list = [torch.ones(1)]
    loop.append(loop)
    assert len(float_leaves(detached_copy(loop))) == 1


def test_a_clone_function_of_the_callers():
    w = torch.nn.Parameter(torch.ones(2))
    kept = detached_copy((w, w * 2), lambda t: t.detach() if isinstance(t, torch.nn.Parameter) else t.clone())
    assert kept[0].data_ptr() == w.data_ptr() and kept[1].data_ptr() != w.data_ptr()

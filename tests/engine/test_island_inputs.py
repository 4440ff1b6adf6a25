"""What crosses into an FP32 island arrives in FP32, whatever container it comes in (issue 34).

On the native path an FP32 island's forward runs with autocast off, so a bf16 tensor handed to it reaches
its FP32 ops as bf16 unless the island's inputs are cast on the way in. The cast goes by structure: every
container torch's pytree knows and dataclasses, nested too.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import pytest
import torch
from torch import nn

import tuner
from tuner.policy.plan import OpInstance, Plan


class Pair(NamedTuple):
    h: torch.Tensor
    g: torch.Tensor


@dataclasses.dataclass(frozen=True)
class Frozen:
    h: torch.Tensor
    g: torch.Tensor


@dataclasses.dataclass
class Nested:
    pairs: list
    scale: float = 1.0


def _unpack(kind: str, packed):
    if kind == "namedtuple":
        return packed.h, packed.g
    if kind == "dict":
        return packed["h"], packed["g"]
    if kind == "frozen-dataclass":
        return packed.h, packed.g
    if kind == "nested":
        return packed.pairs[0][0], packed.pairs[0][1]["g"]
    return packed[0], packed[1]


def _pack(kind: str, h, g):
    return {"namedtuple": lambda: Pair(h, g), "dict": lambda: {"h": h, "g": g},
            "frozen-dataclass": lambda: Frozen(h, g), "nested": lambda: Nested([(h, {"g": g})]),
            "tuple": lambda: (h, g)}[kind]()


class Island(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.lin = nn.Linear(8, 8)

    def forward(self, packed):
        h, g = _unpack(self.kind, packed)
        return torch.nn.functional.linear(h * g, self.lin.weight, self.lin.bias)  # the island's own FP32 op


class Model(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.island = Island(kind)

    def forward(self, x):
        return self.island(_pack(self.kind, self.a(x), self.b(x)))  # a and b run in bf16: bf16 tensors go in


@pytest.mark.parametrize("kind", ["namedtuple", "dict", "frozen-dataclass", "nested", "tuple"])
def test_bf16_tensors_in_any_container_reach_an_fp32_island_in_fp32(kind):
    torch.manual_seed(0)
    model = Model(kind).eval()
    x = torch.randn(4, 8)
    plan = Plan(dtype="bf16", preset="torch-cpu", fp32_instances=(OpInstance("island", "linear", 0),))
    loaded = tuner.attach(model, plan)
    assert tuner.attached(loaded).fp32_islands == ("island",)
    with torch.no_grad():
        out = loaded(x)
        tuner.detach(model)
        with torch.autocast("cpu", torch.bfloat16):  # by hand: a and b low, the island's op in FP32
            h, g = model.a(x), model.b(x)
        want = torch.nn.functional.linear(h.float() * g.float(), model.island.lin.weight, model.island.lin.bias)
    assert out.dtype == torch.float32 and torch.equal(out, want)


class AttrIsland(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.ctx: torch.Tensor | None = None  # set by the caller before each call
        self.extra = {"g": None}

    def forward(self, h):
        w = self.lin.weight  # a low tensor reaching these FP32 linears fails: the dtypes must match
        return torch.nn.functional.linear(h * self.extra["g"], w, self.lin.bias) + torch.nn.functional.linear(
            self.ctx, w)


class AttrModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.island = AttrIsland()

    def forward(self, x):
        self.island.ctx = self.b(x)  # bf16 tensors handed in as attributes, one inside a dict
        self.island.extra = {"g": self.c(x)}
        return self.island(self.a(x))


def test_bf16_tensors_set_as_attributes_of_an_fp32_island_reach_it_in_fp32_and_are_put_back():
    torch.manual_seed(0)
    model = AttrModel().eval()
    x = torch.randn(4, 8)
    plan = Plan(dtype="bf16", preset="torch-cpu", fp32_instances=(OpInstance("island", "linear", 0),))
    loaded = tuner.attach(model, plan)
    with torch.no_grad():
        out = loaded(x)
        assert model.island.ctx.dtype == torch.bfloat16  # the caller's own object again after the call
        assert model.island.extra["g"].dtype == torch.bfloat16
        tuner.detach(model)
        with torch.autocast("cpu", torch.bfloat16):
            h, g, k = model.a(x), model.b(x), model.c(x)
        w = model.island.lin.weight
        want = torch.nn.functional.linear(h.float() * k.float(), w, model.island.lin.bias) + \
            torch.nn.functional.linear(g.float(), w)
    assert out.dtype == torch.float32 and torch.equal(out, want)


class RootIsland(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return torch.tanh(self.b(self.a(x)) @ self.a.weight)  # the root's own matmul: kept FP32 below


def test_a_root_island_reads_no_state_of_mpts_own_and_compiles_whole():
    """The attribute cast reads the island's own attributes only, never mpt's attachment on a root island: a
    walk of it per call would cost time and break torch.compile's graph."""
    model = RootIsland().eval()
    plan = Plan(dtype="bf16", preset="torch-cpu", fp32_instances=(OpInstance("", "matmul", 0),))
    loaded = tuner.attach(model, plan)
    assert tuner.attached(loaded).fp32_islands == ("",)
    x = torch.randn(2, 8)
    torch._dynamo.reset()
    with torch.no_grad():
        eager = loaded(x)
        compiled = torch.compile(loaded, fullgraph=True, backend="aot_eager")(x)
    assert torch.equal(eager, compiled)

"""A `torch.autocast` block the model opens itself runs as torch.autocast runs it on the native path too.

On the native path a low module below an FP32 island gets a wrapper that turns low autocast back on when it
is called with autocast off: off because the island's wrapper turned it off. But the model's own code may
have turned it off (`with torch.autocast(device, enabled=False)`, as every HF rotary embedding does, or an
FP32 head): there the module must stay FP32, as under plain torch.autocast and as mpt's engine claims
(`Rule.MODEL_FP32`). The same for a block the model opens with autocast on: what it calls runs as
torch.autocast runs it (`Rule.MODEL_AUTOCAST`), an FP32 island inside it too.
"""
from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tuner
from tuner import ExecutionPath, OpInstance, Plan
from tuner.core.torch_state import autocast_nesting
from tuner.engine.function_mode import PrecisionEngine
from tuner.policy.presets import load_preset
from tuner.policy.rules import Rule

BF16 = torch.bfloat16


class RootHead(nn.Module):
    """The root is an FP32 island (its own linear FP32) and runs its head in its own FP32 block."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = nn.Linear(8, 8), nn.Linear(8, 8)
        self.w = nn.Parameter(torch.randn(8, 8) / 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.linear(self.body(x), self.w)
        with torch.autocast("cpu", enabled=False):
            return torch.sigmoid(self.head(h.float()))

    def by_hand(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", BF16):
            b = self.body(x)
        return torch.sigmoid(self.head(F.linear(b.float(), self.w)))


class Rotary(nn.Module):
    """Low below an island; opens its own FP32 block around its child, as an HF rotary embedding does."""

    def __init__(self) -> None:
        super().__init__()
        self.inner, self.pre = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pre(x)
        with torch.autocast("cpu", enabled=False):
            return self.inner(h.float())


class Island(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8) / 3)
        self.low, self.head, self.rotary = nn.Linear(8, 8), nn.Linear(8, 8), Rotary()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.low(F.linear(x, self.w))  # the island's own linear FP32, its child low
        with torch.autocast("cpu", enabled=False):
            y = self.head(z.float())  # the model's FP32 block inside the island
        return self.rotary(y) + y


class Nested(nn.Module):
    """A low root with an FP32 island child, whose children meet the model's own FP32 blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.island = nn.Linear(8, 8), Island()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.island(self.inp(x))

    def by_hand(self, x: torch.Tensor) -> torch.Tensor:
        i = self.island
        with torch.autocast("cpu", BF16):
            h = self.inp(x)
            with torch.autocast("cpu", enabled=False):
                z = F.linear(h.float(), i.w)
            z = i.low(z).float()
        y = i.head(z)
        with torch.autocast("cpu", BF16):
            p = i.rotary.pre(y).float()
        return i.rotary.inner(p) + y


class OnBlock(nn.Module):
    """The model opens a low block itself and calls an FP32 island in it: torch.autocast lowers its linear."""

    def __init__(self) -> None:
        super().__init__()
        self.island = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", BF16):  # in the low root: only the nesting depth tells it is the model's
            return self.island(x).float()

    def by_hand(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", BF16):
            return self.island(x).float()


CASES = {"root-head": (RootHead, ""), "nested": (Nested, "island"), "on-block": (OnBlock, "island")}


def _case(name: str) -> tuple[nn.Module, nn.Module, torch.Tensor]:
    """(the model, it with the plan attached natively, an input)."""
    cls, island = CASES[name]
    torch.manual_seed(0)
    model = cls().eval()
    plan = Plan(dtype="bf16", preset="torch-cpu", fp32_instances=(OpInstance(island, "linear", 0),))
    loaded = tuner.attach(model, plan)
    ex = tuner.attached(loaded)
    assert ex.path is ExecutionPath.NATIVE and ex.fp32_islands == (island,)
    return model, loaded, torch.randn(4, 8)


@pytest.mark.parametrize("name", list(CASES))
def test_a_block_the_model_opens_runs_as_torch_autocast_runs_it(name):
    model, loaded, x = _case(name)
    with torch.no_grad():
        out = loaded(x)
        assert autocast_nesting() == 0 and not torch.is_autocast_enabled("cpu")
        tuner.detach(model)
        want = model.by_hand(x)
    assert out.dtype == torch.float32 and torch.equal(out, want)


def test_the_engine_claims_what_runs():
    """mpt's engine (the python path, the recorder) says the model keeps those linears FP32 / lowers them."""
    found: dict[tuple[str, int], tuple[Rule, torch.dtype | None]] = {}

    def record(d, *rest) -> None:
        if d.op == "linear":
            found[(d.module, d.index)] = (d.rule, d.compute)

    for name, cls in (("root-head", RootHead), ("nested", Nested), ("on-block", OnBlock)):
        found.clear()
        model = cls().eval()
        with torch.no_grad(), PrecisionEngine(load_preset("torch-cpu"), BF16, root=model, recorder=record):
            model(torch.randn(4, 8))
        model_fp32 = {k for k, (rule, dtype) in found.items() if rule is Rule.MODEL_FP32 and dtype == torch.float32}
        if name == "root-head":
            assert ("head", 0) in model_fp32
        elif name == "nested":
            assert {("island.head", 0), ("island.rotary.inner", 0)} <= model_fp32
        else:
            assert found[("island", 0)] == (Rule.MODEL_AUTOCAST, BF16)


def test_threads_keep_their_own_regions():
    """Each thread's region switches are its own: a thread inside the island's wrapper does not make another
    thread's model block look like an mpt switch, nor the other way round."""
    model, loaded, x = _case("nested")
    with torch.no_grad():
        want = loaded(x)
    outs: list[torch.Tensor] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            with torch.no_grad():
                outs.extend(loaded(x) for _ in range(10))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(outs) == 40 and all(torch.equal(o, want) for o in outs)


def test_compiles_without_graph_breaks_or_recompiles_and_exports():
    from torch._dynamo.testing import CompileCounterWithBackend

    model, loaded, x = _case("nested")
    with torch.no_grad():
        eager = loaded(x)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(loaded, backend=counter, fullgraph=True)
    with torch.no_grad():
        outs = [compiled(x) for _ in range(4)]
    assert counter.frame_count == 1 and all(torch.equal(o, eager) for o in outs)
    assert autocast_nesting() == 0
    ep = torch.export.export(loaded, (x,))
    with torch.no_grad():
        assert torch.equal(ep.module()(x), eager)

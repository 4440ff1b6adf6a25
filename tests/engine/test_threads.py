"""An attached plan gives the same outputs from several threads as sequentially, on every execution path.

mpt's engine keeps per-forward state (call indices, the module stack, module-override scopes, the scoped
path's regions); shared between threads, one thread's forward would shift another's call indices or end its
engine early, and the model served from a thread pool would compute something else than the tuned plan.
"""
from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from torch import nn

import tuner
from tuner import ExecutionPath, OpInstance, Plan
from tuner.report.checkpoint import save_checkpoint

THREADS = 4
ROUNDS = 12


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(x))
        h = h @ self.fc2.weight.t() + torch.sin(h) @ self.fc2.weight  # two matmuls of the block's own
        return self.norm(x + h)


class Net(nn.Module):
    def __init__(self, width: int = 48) -> None:
        super().__init__()
        self.inp = nn.Linear(16, width)
        self.blocks = nn.Sequential(*(Block(width) for _ in range(3)))
        self.head = nn.Linear(width, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks(self.inp(x))
        return self.head(h) + (h @ h.t()) @ h[:, :8] * 1e-3  # the root's own matmuls


def _model() -> Net:
    torch.manual_seed(0)
    return Net().eval()


# Instances of several modules, including the second matmul of a block (index 1): a shifted index runs another call.
FP32 = (OpInstance("blocks.1", "matmul", 1), OpInstance("blocks.0.fc1", "linear", 0),
        OpInstance("", "matmul", 0), OpInstance("blocks.2", "matmul", 0))


def _plan(path: str) -> Plan:
    if path == "native":
        return Plan(fp32_instances=FP32)
    if path == "scoped":  # a module override to fp16 cannot be a torch.autocast region
        return Plan(fp32_instances=FP32, modules=(("blocks.1", "fp16"),))
    return Plan(fp32_instances=FP32, preset="hmp")


def _attached(path: str, how: str = "attach", folder: Path | None = None) -> nn.Module:
    if how == "attach":
        return tuner.attach(_model(), _plan(path))
    assert folder is not None  # what `mpt tune` writes, loaded as a deployment loads it
    save_checkpoint(_model(), _plan(path), (torch.randn(2, 16),), folder / "model.safetensors")
    _plan(path).save(folder / "plan.yaml")
    return tuner.load(_model(), folder)


@pytest.mark.parametrize("how", ["attach", "load"])
@pytest.mark.parametrize("path", ["native", "scoped", "python"])
def test_threads_give_the_sequential_outputs_bitwise(path, how, tmp_path):
    model = _attached(path, how, tmp_path)
    assert tuner.attached(model).path is ExecutionPath(path)
    torch.manual_seed(1)
    inputs = [torch.randn(24, 16) for _ in range(THREADS)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
    plain = _model()
    with torch.no_grad():
        assert not all(torch.equal(e, plain(x)) for e, x in zip(expected, inputs, strict=True))  # the plan acts
    got: dict[int, list[torch.Tensor]] = {i: [] for i in range(THREADS)}
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def work(i: int) -> None:
        try:
            start.wait()
            with torch.no_grad():
                for _ in range(ROUNDS):
                    got[i].append(model(inputs[i]))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i in range(THREADS):
        assert all(torch.equal(out, expected[i]) for out in got[i]), f"thread {i} computed another plan"
    with torch.no_grad():  # and the model is still as before after the threads
        assert all(torch.equal(model(x), e) for x, e in zip(inputs, expected, strict=True))


def test_one_autocast_context_entered_by_two_threads_leaves_each_its_own_state():
    """`with ctx:` from several threads (a decorated function served from a thread pool): each thread's exit puts
    back its own autocast state, not the state of the thread that entered last. A enters inside its own
    torch.autocast(fp16), B enters with none, A exits first: A must be back in fp16 autocast, B still in bf16."""
    ctx = tuner.autocast("cpu", torch.bfloat16)  # torch's own lists: the fast path, torch.autocast itself
    steps = [threading.Event() for _ in range(3)]
    seen: dict[str, object] = {}
    errors: list[BaseException] = []
    a_in, b_in = torch.randn(4, 4), torch.randn(4, 4)

    def thread_a() -> None:
        try:
            with torch.autocast("cpu", dtype=torch.float16):
                with ctx:
                    steps[0].set()
                    steps[1].wait(10)
                    seen["a inside"] = (a_in @ a_in).dtype
                seen["a after"] = (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"),
                                   (a_in @ a_in).dtype)
            steps[2].set()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            steps[2].set()

    def thread_b() -> None:
        try:
            steps[0].wait(10)
            with ctx:
                steps[1].set()
                steps[2].wait(10)
                seen["b inside"] = (b_in @ b_in).dtype
            seen["b after"] = (torch.is_autocast_enabled("cpu"), (b_in @ b_in).dtype)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert seen["a inside"] == torch.bfloat16 and seen["b inside"] == torch.bfloat16
    assert seen["a after"] == (True, torch.float16, torch.float16)
    assert seen["b after"] == (False, torch.float32)

"""Whether `evaluate` gives the same metric for the same model, told from runs the tune makes anyway.

An evaluate's metric can differ between two runs of the same model only through what it feeds the model
and what it draws at random (a model in eval mode computes the same output from the same input on the
same machine). So the evaluations that decide it (the baseline and the all-low trial) record a
`RunSignature`: a digest of each tensor it passed to the
model's forward (dtype, shape, bytes, in call order) and of the random number generators it moved
(torch's CPU generator, Python's `random` and NumPy's global ones, and the generators evaluate's module
and closure hold, such as a `random.Random(0)` at module level: untouched, or the state it left, which is
the same after every run of an evaluate that reseeds them itself).

The FP32 baseline runs once; the all-low trial, which nearly every search runs next, is the second run.
Matching signatures (`repeatable`) mean evaluate fed the model the same data and drew nothing new at
random, so its metric is deterministic and the baseline needs no second run
(tuner.search.session.TuneSession.settle_noise).
Different signatures, or none, mean it may be noisy, and the baseline is evaluated again, as before.
What mpt cannot see (a generator evaluate creates anew in each call, unseeded, and uses after the forward;
a file that changes between runs) is not covered: `mpt check` evaluates a plan again against the FP32
model.
"""
from __future__ import annotations

import hashlib
import inspect
import pickle
import random
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from tuner.core.inputs import tensor_leaves


def _generator_state(obj: Any) -> bytes | None:
    """The state of a random number generator as bytes; None for anything else."""
    if isinstance(obj, random.Random):
        return pickle.dumps(obj.getstate())
    if isinstance(obj, torch.Generator):
        return obj.get_state().numpy().tobytes()
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(obj, numpy.random.RandomState):
        return pickle.dumps(obj.get_state())
    if numpy is not None and isinstance(obj, numpy.random.Generator):
        return pickle.dumps(obj.bit_generator.state)
    return None


def _user_values(fn: Callable[..., Any], depth: int = 0) -> Iterator[Any]:
    """What `fn` can reach without arguments: its module's globals and its closure (and those of the
    functions a wrapper holds there or on its object: the user's own evaluate behind mpt's wrapper), and one
    level into the attributes of the objects there (a data set object holding its own generator)."""
    fn = inspect.unwrap(fn)
    owner = getattr(fn, "__self__", None)
    fn = getattr(fn, "__func__", fn)
    held = [cell.cell_contents for cell in getattr(fn, "__closure__", None) or () if _filled(cell)]
    if owner is not None:
        held += [owner, *getattr(owner, "__dict__", {}).values()]
    for value in [*getattr(fn, "__globals__", {}).values(), *held]:
        yield value
        attrs = getattr(value, "__dict__", None)
        if isinstance(attrs, dict) and not isinstance(value, (type, types.ModuleType, types.FunctionType)):
            yield from list(attrs.values())
    if depth < 2:
        for value in held:
            if isinstance(value, (types.FunctionType, types.MethodType)) and value is not fn:
                yield from _user_values(value, depth + 1)


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _rng_states(fn: Callable[..., Any] | None) -> bytes:
    """The states of the generators evaluate may draw from, as bytes: torch's, Python's and NumPy's global
    ones, and those `fn` reaches (`_user_values`)."""
    parts = [torch.get_rng_state().numpy().tobytes(), pickle.dumps(random.getstate())]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        parts.append(pickle.dumps(numpy.random.get_state()))
    for value in _user_values(fn) if fn is not None else ():
        state = _generator_state(value)
        if state is not None:
            parts.append(state)
    return b"\0".join(parts)


class RunSignature:
    """Records one run of `evaluate`'s signature: `feed(args, kwargs)` from a forward pre-hook, `start()`
    before it runs and `finish()` after, which returns the hex digest (None when a tensor fed could not be
    read, or was fed while being traced or compiled)."""

    def __init__(self, evaluate: Callable[..., Any] | None = None) -> None:
        self._evaluate = evaluate
        self._inputs = hashlib.sha256()
        self._readable = True
        self._before = b""

    def start(self) -> None:
        self._before = _rng_states(self._evaluate)

    def feed(self, args: Any, kwargs: Any) -> None:
        if torch.jit.is_tracing() or torch.compiler.is_compiling():  # tensors here are the tracer's
            self._readable = False
        if not self._readable:
            return
        for t in tensor_leaves((args, kwargs)):
            try:
                data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()  # no copy on CPU
            except (RuntimeError, TypeError):  # a tensor subclass, sparse or quantized: no bytes to read
                self._readable = False
                return
            self._inputs.update(f"{t.dtype} {tuple(t.shape)}\n".encode())
            self._inputs.update(data.data)  # the array's buffer (a memoryview)

    def finish(self) -> str | None:
        """`<inputs> <generators before> <generators after>`, three digests (hex)."""
        if not self._readable:
            return None
        after = _rng_states(self._evaluate)
        return " ".join(h[:_HEX] for h in (self._inputs.hexdigest(), _sha(self._before), _sha(after)))


_HEX = 32  # hex digits kept of each digest


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def repeatable(first: str | None, second: str | None) -> bool:
    """Whether two runs with these signatures (RunSignature.finish) give the same metric: they fed the model
    the same data, and neither drew at random, or both left the generators in one state from different
    starting states (or from the state the other left): evaluate reseeds them itself."""
    if first is None or second is None:
        return False
    (fed1, before1, after1), (fed2, before2, after2) = first.split(), second.split()
    if fed1 != fed2:
        return False
    drew1, drew2 = before1 != after1, before2 != after2
    if not drew1 and not drew2:
        return True
    return after1 == after2 and (before1 != before2 or not drew1 or not drew2)

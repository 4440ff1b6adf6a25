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

Every evaluation also leaves the states of the generators it moved in the journal (`Draws.moved`), and a
resumed run puts them back where it takes that evaluation from the journal (`restore_generators`): the first
evaluation it makes then draws what it drew in the interrupted run, so an evaluate that reseeds itself is
still told deterministic, a noisy one gives the same metrics, and the resumed run takes the same path
(issue 34: an evaluation from the journal that left torch's generator as a fresh process has it made the
all-low trial look noisy, and the baseline was evaluated again).
What mpt cannot see (a generator evaluate creates anew in each call, unseeded, and uses after the forward;
a file that changes between runs) is not covered: `mpt check` evaluates a plan again against the FP32
model.
"""
from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import inspect
import json
import random
import re
import struct
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import torch

from tuner.core.inputs import tensor_leaves

_SEPARATORS = re.compile(r"[\s:;]")  # what a signature separates its fields with


class _Source(NamedTuple):
    """A random number generator evaluate may draw from: its name in a signature and the journal, and how to
    read its state (a JSON value: the journal keeps it) and put one back."""

    name: str
    read: Callable[[], Any]
    write: Callable[[Any], object]
    seed: Callable[[int], object] | None = None  # start it from a seed (`seed_generators`)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _torch_state(state: torch.Tensor) -> str:
    return _b64(state.numpy().tobytes())


def _torch_tensor(value: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(value)), dtype=torch.uint8)


def _python_state(state: tuple) -> list[Any]:
    """random.getstate() as JSON: its version, its 625 words packed (little-endian uint32), gauss_next."""
    version, words, gauss = state
    return [version, _b64(struct.pack(f"<{len(words)}I", *words)), gauss]


def _python_tuple(value: list[Any]) -> tuple:
    version, packed, gauss = value
    raw = base64.b64decode(packed)
    return version, struct.unpack(f"<{len(raw) // 4}I", raw), gauss


def _numpy_json(value: Any) -> Any:
    """A NumPy generator's state (nested dicts, tuples, arrays and scalars) as JSON; `_numpy_value` undoes it."""
    numpy = sys.modules["numpy"]
    if isinstance(value, dict):
        return {str(k): _numpy_json(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_numpy_json(v) for v in value]
    if isinstance(value, numpy.ndarray):
        return {"ndarray": _b64(value.tobytes()), "dtype": value.dtype.str}
    return value.item() if isinstance(value, numpy.generic) else value


def _numpy_value(value: Any) -> Any:
    numpy = sys.modules["numpy"]
    if isinstance(value, dict) and set(value) == {"ndarray", "dtype"}:
        return numpy.frombuffer(base64.b64decode(value["ndarray"]), dtype=value["dtype"]).copy()
    if isinstance(value, dict):
        return {k: _numpy_value(v) for k, v in value.items()}
    return tuple(_numpy_value(v) for v in value) if isinstance(value, list) else value


def _held_source(name: str, obj: Any) -> _Source | None:
    """`obj` as a _Source when it is a random number generator (torch's, Python's, NumPy's); else None."""
    if isinstance(obj, random.SystemRandom):  # draws from the OS: no state to record or put back
        return None
    if isinstance(obj, random.Random):
        return _Source(name, lambda: _python_state(obj.getstate()), lambda v: obj.setstate(_python_tuple(v)), obj.seed)
    if isinstance(obj, torch.Generator):
        return _Source(name, lambda: _torch_state(obj.get_state()), lambda v: obj.set_state(_torch_tensor(v)),
                       obj.manual_seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(obj, numpy.random.RandomState):
        return _Source(name, lambda: _numpy_json(obj.get_state()), lambda v: obj.set_state(_numpy_value(v)),
                       obj.seed)
    if numpy is not None and isinstance(obj, numpy.random.Generator):
        bits = obj.bit_generator
        return _Source(name, lambda: _numpy_json(bits.state),
                       lambda v: setattr(bits, "state", _numpy_value(v)),
                       lambda k: setattr(bits, "state", type(bits)(k).state))
    return None


def _sources(fn: Callable[..., Any] | None) -> list[_Source]:
    """The generators evaluate may draw from, in a fixed order: torch's, Python's and NumPy's global ones,
    then each one `fn` reaches (`_user_values`), once, by the name it is first reached by (`user.RNG`,
    `user.data.rng`): a resumed run names them alike, and never puts one's state in another."""
    found = [_Source("torch", lambda: _torch_state(torch.get_rng_state()),
                     lambda v: torch.set_rng_state(_torch_tensor(v)), torch.default_generator.manual_seed),
             _Source("random", lambda: _python_state(random.getstate()),
                     lambda v: random.setstate(_python_tuple(v)), random.seed)]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        found.append(_Source("numpy", lambda: _numpy_json(numpy.random.get_state()),
                             lambda v: numpy.random.set_state(_numpy_value(v)), numpy.random.seed))
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # (never initializes CUDA itself)
        found.append(_Source("cuda", lambda: [_torch_state(s) for s in torch.cuda.get_rng_state_all()],
                             lambda v: torch.cuda.set_rng_state_all([_torch_tensor(s) for s in v]),
                             torch.cuda.manual_seed_all))
    seen: set[int] = set()
    for name, value in _user_values(fn) if fn is not None else ():
        source = None if id(value) in seen else _held_source("user." + _SEPARATORS.sub("_", name), value)
        if source is not None:
            seen.add(id(value))
            found.append(source)
    return found


def generator_states(fn: Callable[..., Any] | None) -> dict[str, Any]:
    """The state of each generator evaluate (`fn`) may draw from, by name (JSON values). One whose state
    cannot be read as its kind's is (a subclass of random.Random with a state of its own) is left out."""
    states = {}
    for source in _sources(fn):
        try:
            states[source.name] = source.read()
        except (TypeError, ValueError, NotImplementedError, struct.error):
            continue
    return states


def restore_generators(fn: Callable[..., Any] | None, states: Mapping[str, Any]) -> None:
    """Put back the generator states a journaled run of `fn` left (`Draws.moved`), so that the run after it
    draws what it drew in the run the journal records: a resumed run replays the interrupted one. A state
    that does not fit its generator (a journal edited by hand) is left out: the run after it draws anew."""
    for source in _sources(fn):
        if source.name in states:
            try:
                source.write(states[source.name])
            except (TypeError, ValueError, KeyError, RuntimeError, struct.error, binascii.Error):
                continue


SEED_BASE = 0x5EED  # training run k > 0 of a trial (`--seeds`) starts every generator from SEED_BASE + k


def seed_generators(fn: Callable[..., Any] | None, k: int) -> None:
    """Every generator `fn` may draw from started from seed k's own number (`--seeds`: training run k of each
    trial draws other batches and dropout masks than run 0, which draws as the baseline's first run found the
    generators, and the same as run k of every other trial, so trials still differ only in precision)."""
    for index, source in enumerate(_sources(fn)):
        if source.seed is not None:
            source.seed(SEED_BASE + k * 1009 + index)  # each generator its own number: no two draw alike


def replaying(fn: Callable[..., Any] | None) -> Callable[[], None]:
    """A function that puts every generator `fn` may draw from back in the state it has now: called before each
    build and each evaluation of a training tune (`for_training`), every trial draws what the baseline drew
    (weight initialisation, data shuffling, dropout, DataLoader workers' seeds, which torch's generator gives),
    so trials differ only in precision."""
    states = generator_states(fn)
    return lambda: restore_generators(fn, states)


def drawing_alike(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`fn` (an evaluate) run with every generator it may draw from as its first call found it, in every call:
    `mpt check` of a training plan trains its FP32 baseline and the plan on the same draws, as the tune's
    trials did (`Evaluator` does the same for a training tune)."""
    start: dict[str, Any] = {}

    @functools.wraps(fn)
    def alike(model: Any) -> Any:
        if start:
            restore_generators(fn, start)
        else:
            start.update(generator_states(fn))
        return fn(model)

    return alike


class Draws:
    """What one run of evaluate did to the generators it may draw from: their states before (`start`) and
    after (`finish`), and those it moved (`moved`: what the journal keeps for `restore_generators`)."""

    def __init__(self, evaluate: Callable[..., Any] | None = None) -> None:
        self._evaluate = evaluate
        self.before: dict[str, Any] = {}
        self.after: dict[str, Any] = {}

    def start(self) -> None:
        self.before = generator_states(self._evaluate)

    def finish(self) -> None:
        self.after = generator_states(self._evaluate)

    def moved(self) -> dict[str, Any]:
        """The states the run left that differ from those it found."""
        return {name: state for name, state in self.after.items() if self.before.get(name) != state}


def _user_values(fn: Callable[..., Any], depth: int = 0, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """What `fn` can reach without arguments, each with the name it is reached by: its module's globals and
    its closure (and those of the functions a wrapper holds there or on its object, `wrapped/name`: the user's
    own evaluate behind mpt's wrapper), and one level into the attributes of the objects there (`name.attr`:
    a data set object holding its own generator)."""
    fn = inspect.unwrap(fn)
    owner = getattr(fn, "__self__", None)
    fn = getattr(fn, "__func__", fn)
    names = getattr(getattr(fn, "__code__", None), "co_freevars", ())
    cells = getattr(fn, "__closure__", None) or ()
    held = [(name, cell.cell_contents) for name, cell in zip(names, cells, strict=False) if _filled(cell)]
    if owner is not None:
        held += [("self", owner), *((f"self.{k}", v) for k, v in getattr(owner, "__dict__", {}).items())]
    for name, value in [*getattr(fn, "__globals__", {}).items(), *held]:
        yield prefix + str(name), value
        attrs = getattr(value, "__dict__", None)
        if isinstance(attrs, dict) and not isinstance(value, (type, types.ModuleType, types.FunctionType)):
            yield from ((f"{prefix}{name}.{k}", v) for k, v in list(attrs.items()))
    if depth < 2:
        for name, value in held:
            if isinstance(value, (types.FunctionType, types.MethodType)) and value is not fn:
                yield from _user_values(value, depth + 1, f"{prefix}{name}/")


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


class RunSignature:
    """Records one run of `evaluate`'s signature: `feed(args, kwargs)` from a forward pre-hook, `start()`
    before it runs and `finish()` after, which returns it (None when a tensor fed could not be read, or was
    fed while being traced or compiled). `draws` holds the generator states it read."""

    def __init__(self, evaluate: Callable[..., Any] | None = None) -> None:
        self._inputs = hashlib.sha256()
        self._readable = True
        self.draws = Draws(evaluate)

    def start(self) -> None:
        self.draws.start()

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
        """`<inputs> <name>:<before>:<after>;...`: the digest of the inputs fed, then each generator's digests
        before and after the run (hex). Each generator apart, so one that neither run touched (Python's, seeded
        anew by each process) does not hide that another was reseeded."""
        self.draws.finish()
        if not self._readable:
            return None
        before, after = self.draws.before, self.draws.after
        states = ";".join(f"{name}:{_digest(before.get(name))}:{_digest(state)}" for name, state in after.items())
        return f"{self._inputs.hexdigest()[:_HEX]} {states}"


def _digest(state: Any) -> str:
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()[:_STATE_HEX]


_HEX = 32  # hex digits kept of the inputs' digest
_STATE_HEX = 16  # and of each generator state's


def _parse(signature: str) -> tuple[str, dict[str, tuple[str, str]]] | None:
    """A signature's inputs digest and each generator's (before, after) digests; None when it is not one
    RunSignature.finish writes (a journal from before generators were told apart)."""
    parts = signature.split(" ")
    if len(parts) != 2:
        return None
    states: dict[str, tuple[str, str]] = {}
    for item in parts[1].split(";") if parts[1] else ():
        fields = item.split(":")
        if len(fields) != 3:
            return None
        states[fields[0]] = (fields[1], fields[2])
    return parts[0], states


def _same_draws(first: tuple[str, str], second: tuple[str, str]) -> bool:
    """One generator in two runs: neither drew from it, or both left it in one state: evaluate reseeds it itself
    (from different starting states, or from the state the other left), or both started from one state and
    drew alike (a training tune puts every generator back before each evaluation: `replaying`)."""
    (before1, after1), (before2, after2) = first, second
    drew1, drew2 = before1 != after1, before2 != after2
    if not drew1 and not drew2:
        return True
    return after1 == after2


def repeatable(first: str | None, second: str | None) -> bool:
    """Whether two runs with these signatures (RunSignature.finish) give the same metric: they fed the model
    the same data, and for every generator `_same_draws`."""
    one, two = (None if s is None else _parse(s) for s in (first, second))
    if one is None or two is None or one[0] != two[0] or set(one[1]) != set(two[1]):
        return False
    return all(_same_draws(one[1][name], two[1][name]) for name in one[1])

"""Ranking op instances by how much running them in the lower precision hurts the model's output.

Two scorers, both on example inputs, both in units of relative output error
(‖Δoutput‖ / ‖output‖) so their scores compare:

- `gradient` (default): an FP32 forward pass in which every candidate op also
  computes the error it adds by itself in the lower precision (its local error
  δ, see below), then a few backward passes of random projections vᵀ·output.
  Since E[(vᵀJδ)²] = ‖Jδ‖² for Gaussian v, each op's first-order effect on the
  final output comes out of the same pass: the damage it does downstream, not
  just its local error. Cost: about one forward plus `probes` backward passes
  per group of candidates (one group unless their δ exceed the memory budget).
- `exact`: one forward per candidate with only that op in the lower precision.
  Catches effects a first-order estimate misses (saturation, overflow), at N forwards.
Candidates whose error is non-finite (an overflow) score inf either way: in the gradient ranking, an op whose
lower-precision result is not finite where its FP32 output is (its own cast of an input past the lower
dtype's range included) scores inf, whoever produced that input.

**A candidate's own error.** In the all-low configuration an op's input that
another candidate produced arrives already rounded: that rounding is the
producer's (keeping the consumer in FP32 would not undo it). An input from
anything else (an FP32-list op such as layer_norm, a model input, a weight) is
rounded by the op's own cast. So the gradient ranking computes

    δ_c = f(inputs as c would see them in the all-low configuration)
          − f(inputs, the candidate-produced ones rounded to the lower dtype and back), in FP32

where "as c would see them" follows c's rule: a lower-list op casts every
floating input; a passthrough op (`add`, `sub` with no list of their own)
gets the candidate-produced inputs in the lower dtype and the others as they
are, and torch's type promotion decides (a residual `add` of a bf16 branch
and an FP32 stream computes in FP32 and adds nothing). Which tensors are
candidate outputs is tracked during the pass by identity (weak references),
and passed on through numerically neutral ops (`tuner.policy.opnames.is_neutral`:
views, reshapes, getitem, relu, eval dropout...) whose inputs all carry it.
Tensors that reach an op without passing through the engine (`.T`, `.mT`,
`.detach()`) lose the mark, and the consumer then owns that rounding.

**Memory.** Parameters do not require grad during the gradient ranking, so
autograd keeps no activations for weight gradients. Each candidate's output
becomes a point of the graph by the recorder returning `y + a·δ` (the engine
hands the model the recorder's value), with `a` a 0-dim zero leaf: the output
is unchanged and ∂(vᵀout)/∂a = vᵀJδ directly. The only tensor that node keeps
is δ, stored in bf16 (its FP32 values rounded: a score moves by well under 1%,
half the bytes; bf16 has FP32's range, so no δ overflows), and the candidates
are processed in groups whose δ bytes stay under a
budget (default: max(64 MiB, the model's parameter bytes)); each group is one
shadowed forward plus `probes` backward passes, and only its candidates
compute a lower-precision shadow. Every group uses the same random probes, so
grouping does not change a score. What the budget does not bound is what the
backward pass itself needs: the activations saved by the ops downstream of the
group's first candidate (gelu's input, layer_norm's input, attention's q/k/v),
about what a training step keeps minus the inputs of weight gradients
(`benchmarks/rank_scaling.py --memory` measures both).
"""
from __future__ import annotations

import math
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from tuner.core.inputs import ModelInputs, detached_copy, float_leaves, tensor_leaves
from tuner.core.memory import find_out_of_memory
from tuner.core.sharding import Sharding
from tuner.engine.function_mode import Decision, PrecisionEngine
from tuner.measure.inspection import relative_error
from tuner.policy.opnames import DROPOUT_OPS, NEUTRAL_OPS, is_communication, is_neutral
from tuner.policy.plan import OpInstance
from tuner.policy.presets import Policy
from tuner.policy.rules import Rule

Progress = Callable[[int, int], None]

MIN_BUDGET = 64 << 20  # bytes of δ one gradient pass may hold, at least

_F32 = torch.float32
# What a CUDA backward prints the first time autograd's device thread makes a cuBLAS handle: that thread has
# no current context yet, and torch sets the primary one itself right after (CublasHandlePool.cpp). Nothing for
# the user to act on, so the ranking's backward passes do not show it (issue 33).
_NO_CONTEXT = "Attempting to run cuBLAS, but there was no current CUDA context"
_KEPT = torch.bfloat16  # the dtype δ is kept in between the forward and the backward passes (module doc)
_F64 = torch.float64


def _error(out: Any, ref: Any) -> float:
    err = relative_error(out, ref)
    return float("inf") if err is None or not math.isfinite(err) else err


def rank_exact(model: nn.Module, inputs: ModelInputs | tuple, policy: Policy, dtype: torch.dtype,
               candidates: list[OpInstance], ref_out: Any, progress: Progress | None = None,
               only: list[OpInstance] | None = None,
               raised: Callable[[OpInstance, BaseException], None] | None = None) -> dict[OpInstance, float]:
    """Final-output error with only that instance in the lower precision (one forward each); inf where that
    forward raises (a dtype the model's code reads from one tensor and applies to another), told to `raised`.

    This is the true end-to-end effect of lowering that one instance, which differs from the gradient
    ranking's δ on purpose: here every other candidate runs in FP32, so an input that a producer candidate
    would hand over already rounded arrives in FP32 and the instance's own cast rounds it. An op right after
    a fragile one (a `sub` after a linear whose output loses its signal in bf16) therefore scores about as
    high as its producer here, and near zero in `rank_gradient`, which charges that rounding to the producer.

    One engine serves all the forwards: per instance only one entry of its override table changes, so the
    cost per instance is one forward of the model plus O(1) bookkeeping. `ref_out` is copied first
    (`detached_copy`): a forward that returns the dict it was given, and rewrites it on every call, would
    otherwise rewrite the reference too, scoring every instance 0.
    """
    ref_out = detached_copy(ref_out)
    model_inputs = ModelInputs.of(inputs)
    todo = list(only) if only is not None else list(candidates)
    overrides = {c.key(): _F32 for c in candidates}
    for c in todo:
        overrides.setdefault(c.key(), _F32)
    engine = PrecisionEngine(policy, dtype, root=model, instance_overrides=overrides, as_deployed=True)
    table = engine.instance_overrides  # the engine's own copy: flipped in place, one entry per forward
    scores: dict[OpInstance, float] = {}
    with torch.no_grad():
        for n, cand in enumerate(todo):
            key = cand.key()
            table[key] = dtype
            try:
                with engine:
                    out = model_inputs.call(model)
            except Exception as exc:  # the FP32 forward ran: with this op alone low the model's own code raised
                if find_out_of_memory(exc) is not None:
                    raise
                if raised is not None:
                    raised(cand, exc)
                scores[cand] = math.inf  # a failing plan, scored as one that overflows
            else:
                scores[cand] = _error(out, ref_out)
                del out
            finally:
                table[key] = _F32
            if progress:
                progress(n + 1, len(todo))
    return scores


class _Marks:
    """Identities of the tensors that hold a candidate's (rounded, in the all-low run) output.

    Weak: a mark does not keep its tensor alive, and it goes when the tensor does, so an id reused by a
    later tensor is never mistaken for a marked one.
    """

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref[Tensor]] = {}

    def add(self, t: Tensor) -> None:
        key = id(t)
        ref = self._refs.get(key)
        if ref is not None and ref() is t:
            return
        refs = self._refs

        def gone(r: weakref.ref[Tensor], key: int = key) -> None:
            if refs.get(key) is r:
                del refs[key]

        try:
            refs[key] = weakref.ref(t, gone)
        except TypeError:  # pragma: no cover - a tensor type without weak references: no mark
            pass

    def __contains__(self, t: object) -> bool:
        ref = self._refs.get(id(t))
        return ref is not None and ref() is t

    def clear(self) -> None:
        self._refs.clear()


def _map_args(x: Any, fn: Callable[[Tensor], Any]) -> Any:
    """`fn` on the tensors of an op's argument: itself or the items of a list/tuple (torch.cat's list)."""
    if isinstance(x, Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)) and any(isinstance(i, Tensor) for i in x):
        items = [fn(i) if isinstance(i, Tensor) else i for i in x]
        return tuple(items) if isinstance(x, tuple) else items
    return x


def _arg_tensors(args: tuple, kwargs: dict) -> Iterable[Tensor]:
    for a in (*args, *(v for k, v in kwargs.items() if k != "out")):
        if isinstance(a, Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (i for i in a if isinstance(i, Tensor))


def _first_float(out: Any) -> Tensor | None:
    for t in tensor_leaves(out):
        return t if t.is_floating_point() else None
    return None


def _replace_first(out: Any, new: Tensor) -> Any:
    """`out` with its first tensor replaced by `new`; None when the container cannot be rebuilt."""
    if isinstance(out, Tensor):
        return new
    if isinstance(out, (list, tuple)) and out and isinstance(out[0], Tensor):
        items = [new, *out[1:]]
        if type(out) is list:
            return items
        if type(out) is tuple:
            return tuple(items)
        try:
            return type(out)(*items) if hasattr(out, "_fields") else type(out)(items)  # namedtuple, structseq
        except Exception:  # noqa: BLE001 - a sequence type that cannot be rebuilt: no anchor
            return None
    return None


def _widest(dtypes: list[torch.dtype]) -> torch.dtype:
    out = dtypes[0]
    for d in dtypes[1:]:
        if d != out:
            out = _F32
    return out


class _Shadow:
    """The recorder of one gradient-ranking pass: marks candidate outputs and anchors its group's ones."""

    def __init__(self, wanted: dict[tuple[str, str, int], OpInstance], policy: Policy, dtype: torch.dtype,
                 budget: int, group: set[OpInstance] | None, observer: Callable[..., None] | None = None) -> None:
        self.wanted = wanted
        self.observer = observer  # sees every call of this pass as it ran, in FP32 (the range rule's recorder)
        self.policy = policy
        self.dtype = dtype
        self.budget = budget
        self.group = group  # None: the first pass, which takes candidates in order while the budget lasts
        self.used = 0
        self.closed = False
        self.marks = _Marks()
        self.order: list[OpInstance] = []  # candidates as they ran, with their δ bytes
        self.sizes: dict[OpInstance, int] = {}
        self.shadowed: list[OpInstance] = []
        self.anchors: dict[OpInstance, Tensor] = {}
        self.bad: set[OpInstance] = set()
        self.rest_groups: list[list[OpInstance]] = []  # first pass: the groups the later passes take
        self._rules: dict[str, Rule] = {}

    # ----- which candidates this pass shadows ------------------------------------------------------------
    def _take(self, cand: OpInstance, size: int) -> bool:
        if self.group is not None:
            return cand in self.group
        if self.closed:
            return False
        if self.shadowed and self.used + size > self.budget:
            self.closed = True
            return False
        self.used += size
        return True

    def _eligible(self, t: Any) -> bool:
        return (isinstance(t, Tensor) and t.is_floating_point() and t.dtype != _F64
                and (self.policy.device is None or t.device.type == self.policy.device))

    def _rule(self, op: str) -> Rule:
        rule = self._rules.get(op)
        if rule is None:
            rule = self._rules[op] = self.policy.lookup(op)[0]
        return rule

    # ----- the recorder ----------------------------------------------------------------------------------
    def __call__(self, d: Decision, func: Any, args: tuple, kwargs: dict, out: Any,
                 raw_args: tuple, raw_kwargs: dict) -> Any:
        if self.observer is not None:
            self.observer(d, func, args, kwargs, out, raw_args, raw_kwargs)
        cand = self.wanted.get((d.module, d.op, d.index))
        if cand is None:
            if (d.op in NEUTRAL_OPS or d.op in DROPOUT_OPS or is_communication(d.op)) \
                    and is_neutral(d.op, raw_args, raw_kwargs):
                floats = [t for t in _arg_tensors(raw_args, raw_kwargs) if t.is_floating_point()]
                if floats and all(t in self.marks for t in floats):
                    self._mark(out)
            return None
        result = None
        y = _first_float(out)
        if y is not None and cand not in self.sizes:
            size = y.numel() * _KEPT.itemsize  # δ's bytes as kept
            self.order.append(cand)
            self.sizes[cand] = size
            if self._take(cand, size):
                self.shadowed.append(cand)
                result = self._anchor(cand, d, func, args, kwargs, out, y)
        self._mark(result if result is not None else out)
        return result

    def _mark(self, out: Any) -> None:
        for t in tensor_leaves(out):
            if t.is_floating_point():
                self.marks.add(t)

    def _anchor(self, cand: OpInstance, d: Decision, func: Any, args: tuple, kwargs: dict, out: Any,
                y: Tensor) -> Any:
        with torch.no_grad():
            found = self._delta(d, func, args, kwargs, y)
        if found is None:
            return None
        delta, finite = found
        if not finite:
            self.bad.add(cand)
            return None
        anchor = torch.zeros((), dtype=y.dtype, device=y.device, requires_grad=True)
        kept = delta.to(_KEPT if y.dtype == _F32 else y.dtype)
        replaced = _replace_first(out, torch.addcmul(y, anchor, kept))  # = y, and d/da = δ
        if replaced is not None:
            self.anchors[cand] = anchor
        return replaced

    def _delta(self, d: Decision, func: Any, args: tuple, kwargs: dict, y: Tensor) -> tuple[Tensor, bool] | None:
        """The error candidate `d` adds by itself in the lower precision (see the module doc), and whether it
        is finite; None when the op's lower-precision result does not pair up with its output."""
        low, marks, elig = self.dtype, self.marks, self._eligible
        kwargs = {k: v for k, v in kwargs.items() if k != "out"}
        ins = [t for t in _arg_tensors(args, kwargs) if elig(t)]
        marked = any(t in marks for t in ins)
        rule = self._rule(d.op)
        if rule is Rule.LOWER or not marked or not ins:
            # a lower-list op casts all its inputs; so does any op with no candidate-produced input (it runs
            # low because of a cast outside the candidates' view, which the search cannot undo but its own)
            def conv(t: Tensor) -> Tensor:
                return t.to(low) if elig(t) else t
        else:
            arrived = [low if t in marks else t.dtype for t in ins]
            target = None
            if rule is Rule.PROMOTE:
                target = _widest(arrived)
            elif rule in (Rule.FIRST_INPUT, Rule.INPLACE_FIRST_INPUT, Rule.OUT_FIRST_INPUT):
                target = arrived[0]

            def conv(t: Tensor) -> Tensor:
                if not elig(t):
                    return t
                t2 = t.to(low) if t in marks else t
                return t2 if target is None else t2.to(target)

        low_out = _first_float(func(*[_map_args(a, conv) for a in args],
                                    **{k: _map_args(v, conv) for k, v in kwargs.items()}))
        if marked:
            def rounded(t: Tensor) -> Tensor:
                return t.to(low).to(t.dtype) if elig(t) and t in marks else t

            ref = _first_float(func(*[_map_args(a, rounded) for a in args],
                                    **{k: _map_args(v, rounded) for k, v in kwargs.items()}))
        else:
            ref = y
        if low_out is None or ref is None or low_out.shape != ref.shape:
            return None
        delta = low_out.detach().to(_F32, copy=True)
        delta.sub_(ref.detach())
        if bool(torch.isfinite(delta).all()):
            return delta, True
        # Positions not finite in the op's own FP32 output are not this op's doing; any other is: an input in
        # range in FP32 that the lower dtype cannot hold overflows when this op alone runs low (its own cast of
        # an FP32 input), though the all-low reference rounded it to inf already (issue 39: a GeGLU product
        # into down_proj scored 0.03% and went last in the search's order)
        delta.masked_fill_(~torch.isfinite(y.detach()), 0.0)
        return delta, bool(torch.isfinite(delta).all())


def _partition(order: list[OpInstance], sizes: dict[OpInstance, int], budget: int) -> list[list[OpInstance]]:
    """Consecutive groups (in execution order) whose δ bytes stay under the budget (at least one each)."""
    groups: list[list[OpInstance]] = []
    used = 0
    for c in order:
        if groups and groups[-1] and used + sizes[c] <= budget:
            groups[-1].append(c)
            used += sizes[c]
        else:
            groups.append([c])
            used = sizes[c]
    return groups


def default_budget(model: nn.Module) -> int:
    """Bytes of δ one gradient pass may hold: max(64 MiB, the model's parameter bytes)."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return max(MIN_BUDGET, params)


def _probe_vectors(leaves: list[Tensor], seed: int) -> Iterator[list[Tensor]]:
    """Each probe's vectors: one v per float output (whether a group reaches it or not, so that the k-th probe
    is the same for every group, and grouping does not change a score), kept for the outputs with a graph."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        row = [torch.randn(t.shape, generator=gen, dtype=_F32).to(t.device, t.dtype) for t in leaves]
        yield [v for v, t in zip(row, leaves, strict=False) if t.requires_grad]


def _projections(finals: list[Tensor], anchors: list[Tensor], vectors: Iterator[list[Tensor]], probes: int,
                 batched: bool, tick: Callable[[int], None]) -> list[list[Tensor] | None]:
    """Per anchor, its gradient along each of `probes` probe vectors (one scalar per probe, None where no
    output depends on it); `tick(k)` after k more probes are done. `batched`: all probes in one vmapped
    backward pass, which reads each weight once for all of them (on a 1.1B LM, whose backward the weights'
    reads bound: 3.9-4.6 s against 6.8-7.4 s for 4 probes one at a time), holding every probe's vectors and
    gradient buffers at once; the caller asks for it where the budget holds that and the parameters are not
    DTensors. An op with no batching rule (or a batched pass that fails) falls back to a pass per probe, the
    same probes in the same order."""
    rows = [next(vectors) for _ in range(probes)] if batched else []
    if batched:
        try:
            stacked = [torch.stack([row[j] for row in rows]) for j in range(len(finals))]
            with warnings.catch_warnings():  # vmap's "no batching rule, slower path" notes are ours to absorb
                warnings.simplefilter("ignore", UserWarning)
                grads = torch.autograd.grad(finals, anchors, grad_outputs=stacked, retain_graph=True,
                                            allow_unused=True, is_grads_batched=True)
            tick(probes)
            return [None if g is None else list(g.unbind(0)) for g in grads]
        except (RuntimeError, NotImplementedError):
            pass
    per_probe = []
    for k in range(probes):
        row = rows[k] if rows else next(vectors)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_NO_CONTEXT)
            per_probe.append(torch.autograd.grad(finals, anchors, grad_outputs=row, retain_graph=True,
                                                 allow_unused=True))
        tick(1)
    return [None if per_probe[0][i] is None else [g[i] for g in per_probe] for i in range(len(anchors))]


def rank_gradient(model: nn.Module, inputs: ModelInputs | tuple, policy: Policy, dtype: torch.dtype,
                  candidates: list[OpInstance], ref_out: Any, progress: Progress | None = None,
                  probes: int = 8, seed: int = 0, *, memory_budget: int | None = None,
                  observer: Callable[..., None] | None = None) -> dict[OpInstance, float]:
    """First-order ‖J_c δ_c‖ / ‖output‖ for every candidate, δ_c being the error c adds by itself.

    `memory_budget`: bytes of δ one pass may hold (default `default_budget(model)`); more candidates than
    fit take more passes (each one forward plus `probes` backward passes). `progress(done, total)` is
    called after each backward pass. Parameters' requires_grad flags are off during the passes and
    restored after. `observer` (an engine recorder that returns None) sees every call of the first pass.
    """
    model_inputs = ModelInputs.of(inputs).map(lambda t: t.detach())
    wanted = {c.key(): c for c in candidates}
    budget = default_budget(model) if memory_budget is None else max(1, int(memory_budget))
    overrides = {c.key(): _F32 for c in candidates}
    sums: dict[OpInstance, float] = {}
    bad: set[OpInstance] = set()
    requires = {p: p.requires_grad for p in model.parameters()}
    state = {"done": 0, "total": probes}
    sharded = Sharding.of(model).sharded

    def tick(k: int) -> None:
        state["done"] += k
        if progress:
            progress(state["done"], state["total"])

    def one_pass(group: set[OpInstance] | None) -> _Shadow:
        shadow = _Shadow(wanted, policy, dtype, budget, group, observer if group is None else None)
        with torch.enable_grad():
            with PrecisionEngine(policy, dtype, root=model, instance_overrides=overrides, recorder=shadow,
                                 as_deployed=True):
                out = model_inputs.call(model)
            shadow.marks.clear()
            if group is None:  # the first pass: now the sizes of all candidates are known
                taken = set(shadow.shadowed)
                shadow.rest_groups = _partition([c for c in shadow.order if c not in taken], shadow.sizes, budget)
                state["total"] = probes * (1 + len(shadow.rest_groups))
            leaves = float_leaves(out)
            norm = math.hypot(*(float(torch.linalg.vector_norm(t.detach())) for t in leaves)) or 1.0
            finals = [t for t in leaves if t.requires_grad]
            keys = list(shadow.anchors)
            found = {c: 0.0 for c in keys}
            reached: set[OpInstance] = set()
            if finals and keys:
                anchors = [shadow.anchors[c] for c in keys]
                one_probe = sum(t.numel() * t.element_size() for t in finals)  # its vectors (and as much again
                batched = (shadow.used + 2 * one_probe) * probes <= budget and not sharded  # in gradients)
                grads = _projections(finals, anchors, _probe_vectors(leaves, seed), probes, batched, tick)
                for c, g in zip(keys, grads, strict=False):
                    if g is not None:
                        for x in g:
                            found[c] += float(x) ** 2
                        reached.add(c)
            else:
                tick(probes)
            del out, leaves, finals
            shadow.anchors.clear()
        for c in reached:
            sums[c] = math.sqrt(found[c] / probes) / norm
        bad.update(shadow.bad)
        return shadow

    try:
        for p in requires:
            p.requires_grad_(False)
        first = one_pass(None)
        for group in first.rest_groups:
            one_pass(set(group))
    finally:
        for p, flag in requires.items():
            p.requires_grad_(flag)
    scores = dict(sums)
    for c in bad:
        scores[c] = float("inf")
    # Ops the backward pass cannot see (no gradient path, an output that cannot be anchored) get the exact score.
    missing = [c for c in candidates if c not in scores]
    if missing:
        scores.update(rank_exact(model, model_inputs, policy, dtype, candidates, ref_out, only=missing))
    return scores

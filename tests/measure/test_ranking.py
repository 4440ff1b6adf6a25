"""The rankings (tuner/ranking.py) and the numerically neutral ops (tuner/opnames.py)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tuner.engine.function_mode import PrecisionEngine
from tuner.core.inputs import ModelInputs, tensor_leaves
from tuner.policy.opnames import NEUTRAL_OPS, is_neutral
from tuner.policy.plan import OpInstance
from tuner.policy.presets import load_preset
from tuner.measure.ranking import rank_exact, rank_gradient

POLICY = load_preset("torch-cpu")
BF16 = torch.bfloat16


# --- numerically neutral ops ------------------------------------------------------------------------------
def _calls() -> dict:
    """One call per NEUTRAL_OPS name: fn(x, y, mask, idx) on tensors of shape (2, 4, 6, 6)."""
    interp = F.interpolate
    return {
        "view": lambda x, y, m, i: x.view(-1),
        "view_as": lambda x, y, m, i: x.view_as(y),
        "reshape": lambda x, y, m, i: x.reshape(2, -1),
        "reshape_as": lambda x, y, m, i: x.reshape_as(y),
        "flatten": lambda x, y, m, i: x.flatten(1),
        "unflatten": lambda x, y, m, i: x.unflatten(1, (2, 2)),
        "ravel": lambda x, y, m, i: x.ravel(),
        "squeeze": lambda x, y, m, i: x[:1].squeeze(0),
        "unsqueeze": lambda x, y, m, i: x.unsqueeze(0),
        "transpose": lambda x, y, m, i: x.transpose(0, 1),
        "swapaxes": lambda x, y, m, i: x.swapaxes(1, 2),
        "swapdims": lambda x, y, m, i: x.swapdims(1, 3),
        "permute": lambda x, y, m, i: x.permute(3, 1, 0, 2),
        "movedim": lambda x, y, m, i: x.movedim(0, 3),
        "moveaxis": lambda x, y, m, i: torch.moveaxis(x, 1, 2),
        "t": lambda x, y, m, i: x[0, 0].t(),
        "contiguous": lambda x, y, m, i: x.transpose(2, 3).contiguous(),
        "clone": lambda x, y, m, i: x.clone(),
        "detach": lambda x, y, m, i: x.detach(),
        "expand": lambda x, y, m, i: x[:1].expand(3, -1, -1, -1),
        "expand_as": lambda x, y, m, i: x[:1].expand_as(y),
        "broadcast_to": lambda x, y, m, i: x[:1].broadcast_to(3, 4, 6, 6),
        "broadcast_tensors": lambda x, y, m, i: torch.broadcast_tensors(x, y[:1]),
        "as_strided": lambda x, y, m, i: x.as_strided((3, 3), (1, 2)),
        "narrow": lambda x, y, m, i: x.narrow(1, 1, 2),
        "select": lambda x, y, m, i: x.select(1, 2),
        "getitem": lambda x, y, m, i: x[:, 1:3, ::2],
        "__getitem__": lambda x, y, m, i: x.__getitem__(m),
        "diagonal": lambda x, y, m, i: x.diagonal(0, 2, 3),
        "unfold": lambda x, y, m, i: x.unfold(3, 2, 1),
        "split": lambda x, y, m, i: x.split(2, dim=1),
        "split_with_sizes": lambda x, y, m, i: x.split_with_sizes([1, 3], 1),
        "tensor_split": lambda x, y, m, i: x.tensor_split(3, dim=2),
        "chunk": lambda x, y, m, i: x.chunk(2, 1),
        "unbind": lambda x, y, m, i: x.unbind(1),
        "hsplit": lambda x, y, m, i: torch.hsplit(x, 2),
        "vsplit": lambda x, y, m, i: torch.vsplit(x, 2),
        "dsplit": lambda x, y, m, i: torch.dsplit(x, 2),
        "cat": lambda x, y, m, i: torch.cat([x, y], 1),
        "concat": lambda x, y, m, i: torch.concat([x, y]),
        "concatenate": lambda x, y, m, i: torch.concatenate([x, y], 2),
        "stack": lambda x, y, m, i: torch.stack([x, y]),
        "hstack": lambda x, y, m, i: torch.hstack([x, y]),
        "vstack": lambda x, y, m, i: torch.vstack([x, y]),
        "dstack": lambda x, y, m, i: torch.dstack([x, y]),
        "column_stack": lambda x, y, m, i: torch.column_stack([x[0, 0], y[0, 0]]),
        "repeat": lambda x, y, m, i: x.repeat(1, 2, 1, 1),
        "repeat_interleave": lambda x, y, m, i: x.repeat_interleave(2, dim=1),
        "tile": lambda x, y, m, i: x.tile((2, 1)),
        "flip": lambda x, y, m, i: x.flip(1),
        "fliplr": lambda x, y, m, i: x.fliplr(),
        "flipud": lambda x, y, m, i: x.flipud(),
        "roll": lambda x, y, m, i: x.roll(2, 3),
        "rot90": lambda x, y, m, i: x.rot90(1, (2, 3)),
        "tril": lambda x, y, m, i: x.tril(),
        "triu": lambda x, y, m, i: x.triu(1),
        "diag_embed": lambda x, y, m, i: torch.diag_embed(x[0]),
        "index_select": lambda x, y, m, i: x.index_select(3, i[0, 0, 0]),
        "gather": lambda x, y, m, i: x.gather(3, i),
        "take": lambda x, y, m, i: x.take(i[0, 0]),
        "take_along_dim": lambda x, y, m, i: torch.take_along_dim(x, i, 3),
        "masked_select": lambda x, y, m, i: x.masked_select(m),
        "masked_fill": lambda x, y, m, i: x.masked_fill(m, 0.3),
        "where": lambda x, y, m, i: torch.where(m, x, y),
        "pixel_shuffle": lambda x, y, m, i: F.pixel_shuffle(x, 2),
        "pixel_unshuffle": lambda x, y, m, i: F.pixel_unshuffle(x, 2),
        "channel_shuffle": lambda x, y, m, i: F.channel_shuffle(x, 2),
        "im2col": lambda x, y, m, i: F.unfold(x, 2),
        "pad": lambda x, y, m, i: F.pad(x, (1, 2), value=0.3),
        "constant_pad_nd": lambda x, y, m, i: torch.constant_pad_nd(x, (1, 1), 0.3),
        "reflection_pad1d": lambda x, y, m, i: torch._C._nn.reflection_pad1d(x[0], (2, 2)),
        "reflection_pad2d": lambda x, y, m, i: torch._C._nn.reflection_pad2d(x, (1, 2, 2, 1)),
        "reflection_pad3d": lambda x, y, m, i: torch._C._nn.reflection_pad3d(x[None], (1,) * 6),
        "replication_pad1d": lambda x, y, m, i: torch._C._nn.replication_pad1d(x[0], (2, 2)),
        "replication_pad2d": lambda x, y, m, i: torch._C._nn.replication_pad2d(x, (1, 2, 2, 1)),
        "replication_pad3d": lambda x, y, m, i: torch._C._nn.replication_pad3d(x[None], (1,) * 6),
        "upsample_nearest1d": lambda x, y, m, i: interp(x[0], scale_factor=2),
        "upsample_nearest2d": lambda x, y, m, i: interp(x, scale_factor=2),
        "upsample_nearest3d": lambda x, y, m, i: interp(x[None], scale_factor=2),
        "_upsample_nearest_exact1d": lambda x, y, m, i: interp(x[0], scale_factor=1.5, mode="nearest-exact"),
        "_upsample_nearest_exact2d": lambda x, y, m, i: interp(x, scale_factor=1.5, mode="nearest-exact"),
        "_upsample_nearest_exact3d": lambda x, y, m, i: interp(x[None], scale_factor=1.5, mode="nearest-exact"),
        "embedding": lambda x, y, m, i: F.embedding(i[0, 0], x[0, 0]),
        "relu": lambda x, y, m, i: F.relu(x),
        "relu6": lambda x, y, m, i: F.relu6(x * 4),
        "hardtanh": lambda x, y, m, i: F.hardtanh(x, -0.3, 0.7),
        "clamp": lambda x, y, m, i: x.clamp(-0.3, 0.7),
        "clip": lambda x, y, m, i: x.clip(max=0.3),
        "clamp_min": lambda x, y, m, i: x.clamp_min(0.3),
        "clamp_max": lambda x, y, m, i: x.clamp_max(-0.3),
        "neg": lambda x, y, m, i: -x,
        "negative": lambda x, y, m, i: torch.negative(x),
        "positive": lambda x, y, m, i: torch.positive(x),
        "abs": lambda x, y, m, i: x.abs(),
        "sign": lambda x, y, m, i: x.sign(),
        "sgn": lambda x, y, m, i: x.sgn(),
        "floor": lambda x, y, m, i: x.floor(),
        "ceil": lambda x, y, m, i: x.ceil(),
        "trunc": lambda x, y, m, i: x.trunc(),
        "fix": lambda x, y, m, i: x.fix(),
        "max": lambda x, y, m, i: (x.max(), x.max(dim=1)),
        "min": lambda x, y, m, i: (x.min(), x.min(dim=3)),
        "amax": lambda x, y, m, i: x.amax((1, 2)),
        "amin": lambda x, y, m, i: x.amin(0),
        "maximum": lambda x, y, m, i: torch.maximum(x, y),
        "minimum": lambda x, y, m, i: torch.minimum(x, y),
        "fmax": lambda x, y, m, i: torch.fmax(x, y),
        "fmin": lambda x, y, m, i: torch.fmin(x, y),
        "sort": lambda x, y, m, i: x.sort(dim=3).values,
        "msort": lambda x, y, m, i: torch.msort(x),
        "topk": lambda x, y, m, i: x.topk(3, dim=3).values,
        "kthvalue": lambda x, y, m, i: x.kthvalue(2, 3).values,
        "median": lambda x, y, m, i: (x.median(), x.median(3).values),
        "nanmedian": lambda x, y, m, i: (x.nanmedian(), x.nanmedian(2).values),
        "cummax": lambda x, y, m, i: x.cummax(3).values,
        "cummin": lambda x, y, m, i: x.cummin(2).values,
        "max_pool1d": lambda x, y, m, i: F.max_pool1d(x[0], 2),
        "max_pool2d": lambda x, y, m, i: F.max_pool2d(x, 2),
        "max_pool3d": lambda x, y, m, i: F.max_pool3d(x[None], 2),
        "max_pool1d_with_indices": lambda x, y, m, i: F.max_pool1d(x[0], 3, return_indices=True)[0],
        "max_pool2d_with_indices": lambda x, y, m, i: F.max_pool2d(x, 3, return_indices=True)[0],
        "max_pool3d_with_indices": lambda x, y, m, i: F.max_pool3d(x[None], 2, return_indices=True)[0],
        "adaptive_max_pool1d": lambda x, y, m, i: F.adaptive_max_pool1d(x[0], 4),
        "adaptive_max_pool2d": lambda x, y, m, i: F.adaptive_max_pool2d(x, 4),
        "adaptive_max_pool3d": lambda x, y, m, i: F.adaptive_max_pool3d(x[None], 3),
    }


CALLS = _calls()
# Names the engine never reports itself: `__getitem__` arrives as `getitem`, and `detach` is one of the
# calls it lets through untouched (opnames.SKIP). They are listed so that a caller's own spelling matches.
NOT_REPORTED = {"__getitem__", "detach"}


def _args(dtype: torch.dtype) -> tuple:
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(2, 4, 6, 6, generator=g) * 3).to(dtype)
    y = (torch.randn(2, 4, 6, 6, generator=g) * 3).to(dtype)
    mask = torch.rand(2, 4, 6, 6, generator=g) > 0.5
    idx = torch.randint(0, 6, (2, 4, 6, 6), generator=g)
    return x, y, mask, idx


def test_every_neutral_op_has_a_property_check():
    assert set(CALLS) == set(NEUTRAL_OPS)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_neutral_ops_computed_low_equal_fp32_rounded(dtype):
    """op(x) in the lower dtype == round(op(x as FP32)): the op's precision cannot change the numbers."""
    x, y, mask, idx = _args(dtype)
    failed, unsupported = [], []
    for name, fn in sorted(CALLS.items()):
        try:
            low = fn(x, y, mask, idx)
        except (RuntimeError, NotImplementedError):  # no kernel for this dtype on this CPU build
            if dtype is torch.bfloat16:
                raise
            unsupported.append(name)
            continue
        ref = fn(x.float(), y.float(), mask, idx)
        pairs = list(zip(tensor_leaves(low), tensor_leaves(ref)))
        assert pairs, name
        for a, b in pairs:
            if not b.is_floating_point():
                continue
            assert a.dtype == dtype, (name, a.dtype)
            if not torch.equal(a, b.to(dtype)):
                failed.append(name)
                break
    assert not failed, f"not neutral in {dtype}: {failed}"
    assert len(unsupported) < len(CALLS) // 4, unsupported


def test_neutral_op_names_are_the_engines():
    """Each name is what the engine reports for that call (Decision.op), so find_candidates can match it."""
    x, y, mask, idx = _args(torch.float32)
    missing = []
    for name, fn in CALLS.items():
        if name in NOT_REPORTED:
            continue
        seen: list[str] = []
        with torch.no_grad(), PrecisionEngine(POLICY, BF16, recorder=lambda d, *a: seen.append(d.op)):
            fn(x, y, mask, idx)
        if name not in seen:
            missing.append((name, seen))
    assert not missing


def test_dropout_is_neutral_only_when_not_training():
    x = torch.randn(3, 4)
    assert is_neutral("dropout", (x, 0.1, False), {})
    assert not is_neutral("dropout", (x, 0.1, True), {})
    assert not is_neutral("dropout", (x, 0.1), {})  # F.dropout's default: training=True
    assert is_neutral("dropout", (x,), {"p": 0.1, "training": False})
    assert is_neutral("feature_dropout", (x, 0.1), {"train": False})
    assert not is_neutral("alpha_dropout", (x, 0.1), {"training": True})
    assert not is_neutral("linear", (x, x), {}) and not is_neutral("add", (x, x), {})

    for mode, expected in (("eval", True), ("train", False)):
        found = []
        drop = getattr(nn.Sequential(nn.Dropout(0.1), nn.Dropout2d(0.1)), mode)()
        x = torch.randn(2, 3, 4, 4)
        with torch.no_grad(), PrecisionEngine(POLICY, BF16, root=drop,
                                              recorder=lambda d, f, a, k, *r: found.append(is_neutral(d.op, a, k))):
            drop(x)
        assert found == [expected, expected], mode


# --- ranking ----------------------------------------------------------------------------------------------
def _candidates(model: nn.Module, inputs: ModelInputs) -> list[OpInstance]:
    found = []

    def record(d, func, args, kwargs, out, *raw):
        if d.lowered and not d.forced and not is_neutral(d.op, args, kwargs):
            found.append(OpInstance(d.module, d.op, d.index))

    with torch.no_grad(), PrecisionEngine(POLICY, BF16, root=model, recorder=record):
        inputs.call(model)
    return found


def _ref(model: nn.Module, inputs: ModelInputs):
    with torch.no_grad():
        return inputs.call(model)


class _Fragile(nn.Module):
    """A linear whose output is 64 + a small signal (bf16 spacing at 64 is 0.5), then a `sub` that takes
    the 64 away, a residual `add` onto an FP32 layer_norm stream, and a head."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.fragile = nn.Linear(16, 16)
        self.other = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 4)
        with torch.no_grad():
            self.fragile.weight.copy_(torch.randn(16, 16, generator=g) * 0.02)
            self.fragile.bias.fill_(64.0)

    def forward(self, x):
        h = self.fragile(x).view(-1, 4, 4).flatten(1) - 64.0  # the mark goes through view/flatten
        h = torch.relu(self.other(x)) + self.norm(x) + 10 * h
        return self.head(h)


def test_a_sub_after_a_fragile_linear_is_charged_nothing_for_its_input():
    model = _Fragile().eval()
    inputs = ModelInputs.of((torch.randn(32, 16, generator=torch.Generator().manual_seed(1)),))
    cands = _candidates(model, inputs)
    by = {c.label(): c for c in cands}
    assert {"fragile:linear#0", "(root):sub#0"} <= set(by)
    # the first add sums a bf16 relu(linear) and an FP32 layer_norm output: torch computes it in FP32, so the
    # engine says fp32 and it is no candidate (keeping it in FP32 would change nothing)
    assert "(root):add#0" not in by
    assert not any(c.op in ("view", "flatten", "relu") for c in cands)
    ref = _ref(model, inputs)
    g = rank_gradient(model, inputs, POLICY, BF16, cands, ref)
    lin, sub = g[by["fragile:linear#0"]], g[by["(root):sub#0"]]
    assert lin > 0.05 and sub * 10 <= lin
    # rank_exact measures the end-to-end effect of lowering only that op: the sub then rounds its own input
    e = rank_exact(model, inputs, POLICY, BF16, cands, ref)
    assert e[by["(root):sub#0"]] > 0.1 * e[by["fragile:linear#0"]]


class _MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(32, 32) for _ in range(4))
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        for lin in self.layers:
            x = torch.relu(lin(x))
        return self.head(x)


def test_scores_are_finite_and_ordered_on_an_mlp():
    torch.manual_seed(0)
    model = _MLP().eval()
    inputs = ModelInputs.of((torch.randn(64, 32),))
    cands = _candidates(model, inputs)
    assert [c.label() for c in cands] == [f"layers.{i}:linear#0" for i in range(4)] + ["head:linear#0"]
    ref = _ref(model, inputs)
    g = rank_gradient(model, inputs, POLICY, BF16, cands, ref)
    e = rank_exact(model, inputs, POLICY, BF16, cands, ref)
    assert set(g) == set(cands) and all(math.isfinite(s) and s > 0 for s in g.values())
    # the ops nearest the output do the most damage here, and both rankings see it
    assert set(sorted(cands, key=g.get)[-2:]) == set(sorted(cands, key=e.get)[-2:]) == set(cands[-2:])
    for c in cands:  # same units as the exact scores
        assert 0.25 < g[c] / e[c] < 4, c


class _Embedder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.proj = nn.Linear(16, 16)
        self.out = nn.Linear(16, 8)

    def forward(self, ids, mask=None):
        h = self.proj(self.emb(ids))
        if mask is not None:
            h = h * mask[..., None]
        return {"logits": self.out(torch.relu(h)), "ids": ids, "hidden": h}


def test_integer_inputs_keyword_call_and_dict_output():
    model = _Embedder().eval()
    ids = torch.randint(0, 50, (4, 7), generator=torch.Generator().manual_seed(2))
    inputs = ModelInputs(kwargs={"ids": ids, "mask": torch.ones(4, 7)})
    cands = _candidates(model, inputs)
    assert {c.label() for c in cands} >= {"proj:linear#0", "out:linear#0"}
    ref = _ref(model, inputs)
    done = []
    scores = rank_gradient(model, inputs, POLICY, BF16, cands, ref, progress=lambda d, t: done.append((d, t)))
    assert set(scores) == set(cands)
    assert all(math.isfinite(s) and s > 0 for c, s in scores.items() if c.op == "linear")
    assert done[-1][0] == done[-1][1] == 8  # one pass: 8 probes
    assert all(p.requires_grad for p in model.parameters()) and all(p.grad is None for p in model.parameters())


class _Mixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.idx = nn.Parameter(torch.tensor([0, 2, 3]), requires_grad=False)
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(3, 2)
        self.fc2.weight.requires_grad_(False)

    def forward(self, x):
        return self.fc2(self.fc1(x)[:, self.idx])


@pytest.mark.parametrize("scorer", [rank_gradient, rank_exact])
def test_requires_grad_flags_are_restored(scorer):
    model = _Mixed()
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    inputs = ModelInputs.of((torch.randn(5, 4),))
    cands = _candidates(model, inputs)
    scores = scorer(model, inputs, POLICY, BF16, cands, _ref(model, inputs))
    assert set(scores) == set(cands) and all(math.isfinite(s) for s in scores.values())
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    assert all(p.grad is None for p in model.parameters())


def test_groups_give_the_same_scores_as_one_pass():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True)
    model = nn.Sequential(layer, nn.Linear(32, 8)).eval()
    inputs = ModelInputs.of((torch.randn(3, 10, 32),))
    cands = _candidates(model, inputs)
    ref = _ref(model, inputs)
    one_pass, grouped = [], []
    a = rank_gradient(model, inputs, POLICY, BF16, cands, ref, progress=lambda d, t: one_pass.append(t))
    b = rank_gradient(model, inputs, POLICY, BF16, cands, ref, progress=lambda d, t: grouped.append(t),
                      memory_budget=3 * 10 * 32 * 2 * 2)  # δ (bf16) of two (3, 10, 32) outputs per pass
    assert one_pass[-1] == 8 and grouped[-1] > 8 * 3  # more passes, each with its 8 probes
    assert set(a) == set(b) == set(cands)
    for c in cands:
        assert b[c] == pytest.approx(a[c], rel=1e-6, abs=1e-12), c
    assert all(math.isfinite(s) for s in a.values()) and any(s > 0 for s in a.values())


def _mlp_model() -> tuple[nn.Module, ModelInputs]:
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(16, 48), nn.GELU(), nn.Linear(48, 48), nn.LayerNorm(48), nn.Linear(48, 4)).eval()
    return model, ModelInputs.of((torch.randn(6, 16),))


def test_the_batched_backward_gives_the_scores_of_one_backward_per_probe(monkeypatch):
    model, inputs = _mlp_model()
    cands, ref = _candidates(model, inputs), _ref(model, inputs)
    batched_calls: list[bool] = []
    real = torch.autograd.grad

    def grad(*args, **kwargs):
        batched_calls.append(bool(kwargs.get("is_grads_batched")))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.autograd, "grad", grad)
    a = rank_gradient(model, inputs, POLICY, BF16, cands, ref)
    assert batched_calls == [True]  # all 8 probes in one pass
    batched_calls.clear()
    deltas = sum(6 * m.out_features * 2 for m in model if isinstance(m, nn.Linear)) + 6 * 48 * 2 * 2
    b = rank_gradient(model, inputs, POLICY, BF16, cands, ref, memory_budget=deltas)  # one group, 8x not held
    assert batched_calls == [False] * 8
    assert set(a) == set(b) == set(cands)
    for c in cands:
        assert b[c] == pytest.approx(a[c], rel=1e-5, abs=1e-12), c


def test_an_op_without_a_batching_rule_falls_back_to_one_pass_per_probe(monkeypatch):
    model, inputs = _mlp_model()
    cands, ref = _candidates(model, inputs), _ref(model, inputs)
    expected = rank_gradient(model, inputs, POLICY, BF16, cands, ref)
    real = torch.autograd.grad

    def grad(*args, **kwargs):
        if kwargs.get("is_grads_batched"):
            raise RuntimeError("Batching rule not implemented for aten::some_op")
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.autograd, "grad", grad)
    done: list[int] = []
    got = rank_gradient(model, inputs, POLICY, BF16, cands, ref, progress=lambda d, t: done.append(d))
    assert got == pytest.approx(expected, rel=1e-5)
    assert done == list(range(1, 9))  # progress after each of the 8 passes

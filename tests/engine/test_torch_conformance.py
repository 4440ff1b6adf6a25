"""torch-cpu preset vs torch.autocast("cpu", bfloat16): same output dtype, bitwise-equal values, op by op.

The engine is forced (engine="python"), so this checks mpt's own rules, not
the fast path that delegates to torch.autocast.
"""
import pytest
import torch
import torch.nn.functional as F

import tuner
from tuner.policy.presets import load_preset

g = torch.Generator().manual_seed(0)


def r(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=g).to(dtype)


def pos(*shape):
    return torch.rand(*shape, generator=g) + 0.1


def spd(n):
    a = r(n, n)
    return a @ a.t() + n * torch.eye(n)


def lstm(**kw):
    """nn.LSTM as a callable: on CPU torch.autocast lowers it through mkldnn_rnn_layer, below Python."""
    with torch.random.fork_rng():
        torch.manual_seed(1)
        module = torch.nn.LSTM(16, 32, **kw)
    return lambda x: module(x)


def cell(kind, **kw):
    """An nn.GRUCell/LSTMCell/RNNCell as a callable: ATen composites whose `linear` calls torch.autocast lowers."""
    with torch.random.fork_rng():
        torch.manual_seed(2)
        module = kind(8, 16, **kw)
    return lambda *a: module(*a)


# (list the op belongs to, case name, callable, args) -- fp32 inputs for lower ops, bf16 inputs for fp32 ops.
B = torch.bfloat16
CASES = [
    # lower-precision list
    ("lower", "conv1d", F.conv1d, (r(2, 3, 8), r(4, 3, 3))),
    ("lower", "conv2d", F.conv2d, (r(2, 3, 6, 6), r(4, 3, 3, 3), r(4))),
    ("lower", "conv3d", F.conv3d, (r(1, 2, 4, 4, 4), r(3, 2, 2, 2, 2))),
    ("lower", "mkldnn_rnn_layer-lstm", lstm(), (r(5, 2, 16),)),
    ("lower", "mkldnn_rnn_layer-lstm-2-layers-bidirectional", lstm(num_layers=2, bidirectional=True,
                                                               batch_first=True), (r(2, 5, 16),)),
    ("lower", "mkldnn_rnn_layer-lstm-no-bias", lstm(bias=False), (r(5, 16),)),
    ("lower", "conv_transpose1d", F.conv_transpose1d, (r(2, 3, 5), r(3, 4, 3))),
    ("lower", "conv_transpose2d", F.conv_transpose2d, (r(1, 3, 4, 4), r(3, 2, 3, 3))),
    ("lower", "conv_transpose3d", F.conv_transpose3d, (r(1, 2, 3, 3, 3), r(2, 2, 2, 2, 2))),
    ("lower", "conv_tbc", torch.conv_tbc, (r(5, 2, 3), r(3, 3, 4), r(4))),
    ("lower", "bmm", torch.bmm, (r(2, 3, 4), r(2, 4, 5))),
    ("lower", "mm", torch.mm, (r(3, 4), r(4, 5))),
    ("lower", "baddbmm", torch.baddbmm, (r(2, 3, 5), r(2, 3, 4), r(2, 4, 5))),
    ("lower", "addmm", torch.addmm, (r(3, 5), r(3, 4), r(4, 5))),
    ("lower", "addbmm", torch.addbmm, (r(3, 5), r(2, 3, 4), r(2, 4, 5))),
    ("lower", "linear", F.linear, (r(3, 4), r(5, 4), r(5))),
    ("lower", "matmul", torch.matmul, (r(2, 3, 4), r(4, 5))),
    ("lower", "__matmul__", lambda a, b: a @ b, (r(3, 4), r(4, 2))),
    ("lower", "linalg_vecdot", torch.linalg.vecdot, (r(3, 4), r(3, 4))),
    ("lower", "prelu", F.prelu, (r(2, 3, 4), pos(3))),
    ("lower", "scaled_dot_product_attention", F.scaled_dot_product_attention, (r(1, 2, 4, 8), r(1, 2, 4, 8), r(1, 2, 4, 8))),
    ("lower", "einsum", lambda a, b: torch.einsum("ij,jk->ik", a, b), (r(3, 4), r(4, 5))),
    ("lower", "tensordot", lambda a, b: torch.tensordot(a, b, dims=1), (r(3, 4), r(4, 5))),
    # recurrent cells: lowered inside (their two addmm), the gate arithmetic in the dtypes that gives (issue 34)
    ("lower", "gru_cell", cell(torch.nn.GRUCell), (r(4, 8), r(4, 16))),
    ("lower", "gru_cell-bf16-input", cell(torch.nn.GRUCell), (r(4, 8, dtype=B), r(4, 16))),
    ("lower", "gru_cell-unbatched", cell(torch.nn.GRUCell, bias=False), (r(8), r(16))),
    ("lower", "lstm_cell", cell(torch.nn.LSTMCell), (r(4, 8), (r(4, 16), r(4, 16)))),
    ("lower", "rnn_tanh_cell", cell(torch.nn.RNNCell), (r(4, 8), r(4, 16))),
    ("lower", "rnn_relu_cell", cell(torch.nn.RNNCell, nonlinearity="relu"), (r(4, 8, dtype=B), r(4, 16))),
    # inner / tensordot of two 1-d tensors run as ATen's dot, which CPU autocast does not lower (issue 34)
    ("none", "inner-1d", torch.inner, (r(8), r(8))),
    ("none", "tensordot-1d", lambda a, b: torch.tensordot(a, b, dims=1), (r(8), r(8))),
    ("lower", "inner", torch.inner, (r(3, 8), r(5, 8))),
    ("lower", "chain_matmul", lambda a, b, c: torch.linalg.multi_dot([a, b, c]), (r(3, 4), r(4, 5), r(5, 2))),
    # FP32 list
    ("fp32", "mse_loss", F.mse_loss, (r(4, 3, dtype=B), r(4, 3, dtype=B))),
    ("fp32", "l1_loss", F.l1_loss, (r(4, 3, dtype=B), r(4, 3, dtype=B))),
    ("fp32", "smooth_l1_loss", F.smooth_l1_loss, (r(4, 3, dtype=B), r(4, 3, dtype=B))),
    ("fp32", "huber_loss", F.huber_loss, (r(4, 3, dtype=B), r(4, 3, dtype=B))),
    ("fp32", "cross_entropy", F.cross_entropy, (r(4, 5, dtype=B), torch.tensor([0, 1, 2, 3]))),
    ("fp32", "nll_loss", F.nll_loss, (r(4, 5, dtype=B), torch.tensor([0, 1, 2, 3]))),
    ("fp32", "nll_loss2d", F.nll_loss, (r(2, 5, 3, 3, dtype=B), torch.randint(0, 5, (2, 3, 3), generator=g))),
    ("fp32", "kl_div", F.kl_div, (r(4, 3, dtype=B), pos(4, 3).to(B))),
    ("fp32", "binary_cross_entropy", F.binary_cross_entropy, (pos(4).clamp(max=0.9).to(B), pos(4).clamp(max=0.9).to(B))),
    ("fp32", "binary_cross_entropy_with_logits", F.binary_cross_entropy_with_logits, (r(4, dtype=B), pos(4).clamp(max=1).to(B))),
    ("fp32", "poisson_nll_loss", F.poisson_nll_loss, (r(4, dtype=B), pos(4).to(B))),
    ("fp32", "hinge_embedding_loss", F.hinge_embedding_loss, (r(4, dtype=B), torch.tensor([1.0, -1.0, 1.0, -1.0]).to(B))),
    ("fp32", "soft_margin_loss", F.soft_margin_loss, (r(4, dtype=B), torch.tensor([1.0, -1.0, 1.0, -1.0]).to(B))),
    ("fp32", "margin_ranking_loss", F.margin_ranking_loss, (r(4, dtype=B), r(4, dtype=B), torch.tensor([1.0, -1.0, 1.0, -1.0]).to(B))),
    ("fp32", "cosine_embedding_loss", F.cosine_embedding_loss, (r(4, 3, dtype=B), r(4, 3, dtype=B), torch.tensor([1.0, -1.0, 1.0, -1.0]).to(B))),
    ("fp32", "triplet_margin_loss", F.triplet_margin_loss, (r(4, 3, dtype=B), r(4, 3, dtype=B), r(4, 3, dtype=B))),
    ("fp32", "multi_margin_loss", F.multi_margin_loss, (r(4, 5, dtype=B), torch.tensor([0, 1, 2, 3]))),
    ("fp32", "multilabel_margin_loss", F.multilabel_margin_loss, (r(2, 4, dtype=B), torch.tensor([[0, 1, -1, 2], [2, -1, 0, 1]]))),
    ("fp32", "cdist", torch.cdist, (r(3, 4, dtype=B), r(5, 4, dtype=B))),
    ("fp32", "prod", torch.prod, (r(3, 4, dtype=B),)),
    ("fp32", "trace", torch.trace, (r(4, 4, dtype=B),)),
    ("fp32", "inverse", torch.inverse, (spd(4).to(B),)),
    ("fp32", "cholesky", torch.linalg.cholesky, (spd(4).to(B),)),
    ("fp32", "linalg_inv", torch.linalg.inv, (spd(4).to(B),)),
    ("fp32", "linalg_solve", torch.linalg.solve, (spd(4).to(B), r(4, 2, dtype=B))),
    ("fp32", "linalg_svdvals", torch.linalg.svdvals, (r(4, 3, dtype=B),)),
    ("fp32", "linalg_eigvalsh", torch.linalg.eigvalsh, (spd(4).to(B),)),
    ("fp32", "pinverse", torch.pinverse, (r(4, 3, dtype=B),)),
    ("fp32", "quantile", lambda x: torch.quantile(x, 0.3), (r(8, dtype=B),)),
    ("fp32", "fft_fft", torch.fft.fft, (r(8, dtype=B),)),
    ("fp32", "fft_rfft", torch.fft.rfft, (r(8, dtype=B),)),
    ("fp32", "max_pool3d", F.max_pool3d, (r(1, 1, 4, 4, 4, dtype=B), 2)),
    ("fp32", "avg_pool3d", F.avg_pool3d, (r(1, 1, 4, 4, 4, dtype=B), 2)),
    ("fp32", "adaptive_avg_pool3d", F.adaptive_avg_pool3d, (r(1, 1, 4, 4, 4, dtype=B), 2)),
    ("fp32", "adaptive_max_pool3d", F.adaptive_max_pool3d, (r(1, 1, 4, 4, 4, dtype=B), 2)),
    ("fp32", "grid_sampler", lambda x, grid: F.grid_sample(x, grid, align_corners=False), (r(1, 1, 4, 4, dtype=B), (torch.rand(1, 3, 3, 2, generator=g) * 2 - 1).to(B))),
    ("fp32", "polar", torch.polar, (pos(3).to(B), r(3, dtype=B))),
    ("fp32", "reflection_pad2d", lambda x: F.pad(x, (1, 1, 1, 1), mode="reflect"), (r(1, 2, 4, 4, dtype=B),)),
    ("fp32", "replication_pad1d", lambda x: F.pad(x, (2, 1), mode="replicate"), (r(1, 2, 5, dtype=B),)),
    ("none", "pad-constant", lambda x: F.pad(x, (1, 1)), (r(2, 3, dtype=B),)),
    # promote list
    ("promote", "cat", lambda a, b: torch.cat([a, b]), (r(2, 3, dtype=B), r(2, 3))),
    ("promote", "stack", lambda a, b: torch.stack([a, b]), (r(2, 3, dtype=B), r(2, 3))),
    ("promote", "stack-same", lambda a, b: torch.stack([a, b]), (r(2, 3, dtype=B), r(2, 3, dtype=B))),
    ("promote", "index_copy", lambda a, b: a.index_copy(0, torch.tensor([0, 2]), b), (r(3, 2, dtype=B), r(2, 2))),
    # unlisted on CPU: run in their input types
    ("none", "softmax", lambda x: torch.softmax(x, -1), (r(3, 4, dtype=B),)),
    ("none", "layer_norm", lambda x: F.layer_norm(x, (4,)), (r(3, 4, dtype=B),)),
    ("none", "add-mixed", torch.add, (r(3, dtype=B), r(3))),
    ("none", "relu", torch.relu, (r(3, 4),)),
    # eligibility rules: float64, explicit dtype, in-place
    ("none", "mm-float64", torch.mm, (r(3, 4, dtype=torch.float64), r(4, 5, dtype=torch.float64))),
    ("none", "softmax-dtype", lambda x: torch.softmax(x, -1, dtype=torch.float64), (r(3, 4, dtype=B),)),
    ("none", "addmm_-inplace", lambda c, a, b: c.clone().addmm_(a, b), (r(3, 5), r(3, 4), r(4, 5))),
    ("none", "mm-out", lambda a, b: torch.mm(a, b, out=torch.empty(3, 5)), (r(3, 4), r(4, 5))),
]


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat(o)]
    return []


@pytest.mark.parametrize("kind,name,fn,args", CASES, ids=[c[1] for c in CASES])
def test_torch_cpu_preset_matches_torch_autocast_bitwise(kind, name, fn, args):
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            expected = fn(*args)
    except RuntimeError as exc:  # e.g. oneDNN builds no bf16 LSTM on an AVX2-only CPU
        pytest.skip(f"the reference, torch.autocast, cannot run {name} on this CPU "
                    f"({torch.backends.cpu.get_cpu_capability()}): {str(exc).splitlines()[0][:120]}")
    with tuner.autocast("torch-cpu", "bf16", engine="python"):
        got = fn(*args)
    exp, out = _flat(expected), _flat(got)
    assert len(exp) == len(out) > 0
    for e, o in zip(exp, out):
        assert o.dtype == e.dtype, f"{name}: {o.dtype} vs torch.autocast's {e.dtype}"
        assert torch.equal(o, e) or (o.isnan().any() and torch.equal(o.isnan(), e.isnan())), f"{name}: values differ"


def test_every_case_op_is_in_the_list_it_claims():
    pol = load_preset("torch-cpu")
    for kind, name, _fn, _args in CASES:
        if kind == "none":
            continue
        op = name.split("-")[0]
        assert pol.rule_for(op)[0] == kind, (name, pol.rule_for(op))


def test_cases_cover_most_of_torch_cpu_lists():
    pol = load_preset("torch-cpu")
    covered = {c[1].split("-")[0] for c in CASES}
    aten = set(pol.lower | pol.fp32 | pol.promote)
    assert len(covered & aten) >= 50


@pytest.mark.parametrize("kind", ["packed", "projections"])
def test_lstm_paths_outside_onednn_keep_torch_autocast_dtypes(kind):
    """Packed sequences and proj_size > 0 skip mkldnn_rnn_layer; torch.autocast then decides per inner op
    (packed: FP32 out, projections: bf16 out) and mpt must give the same output dtype."""
    from torch.nn.utils.rnn import pack_padded_sequence

    module = torch.nn.LSTM(16, 32, proj_size=8 if kind == "projections" else 0)
    x = r(5, 2, 16)
    arg = pack_padded_sequence(x, [5, 3]) if kind == "packed" else x
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = module(arg)[0]
    with torch.no_grad(), tuner.autocast("torch-cpu", "bf16", engine="python"):
        got = module(arg)[0]
    if kind == "packed":
        expected, got = expected.data, got.data
    assert got.dtype == expected.dtype


def test_lstm_trains_through_the_casts():
    module = torch.nn.LSTM(16, 32)
    with tuner.autocast("torch-cpu", "bf16", engine="python"):
        out = module(r(5, 2, 16))[0]
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert module.weight_ih_l0.grad is not None and module.weight_ih_l0.grad.dtype == torch.float32

"""The policy engine's rules, each on real ops."""
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tuner
from tuner.engine.function_mode import PrecisionEngine
from tuner.core.errors import ConfigError
from tuner.policy.presets import Policy
from tuner.policy.rules import Rule

BF16, F32, F64 = torch.bfloat16, torch.float32, torch.float64

TORCHLIKE = Policy("t", lower=frozenset({"linear", "matmul", "mm", "bmm", "baddbmm", "conv2d"}), fp32=frozenset({"softmax", "mse_loss"}),
                   promote=frozenset({"cat", "stack"}), unlisted="passthrough", inplace="skip")
HMPLIKE = Policy("h", lower=frozenset({"linear", "matmul", "mul"}), fp32=frozenset({"softmax", "truediv"}),
                 promote=frozenset({"add", "mul", "cat", "iadd", "truediv"}), unlisted="first_input",
                 inplace="first_input")


def run(policy, fn, **kw):
    decisions = []
    with PrecisionEngine(policy, BF16, verbose=decisions.append, **kw):
        out = fn()
    return out, decisions


def test_lower_list_casts_fp32_inputs_down():
    lin = nn.Linear(4, 3)
    out, ds = run(TORCHLIKE, lambda: lin(torch.randn(2, 4)))
    assert out.dtype == BF16
    assert ds[-1].op == "linear" and ds[-1].compute is BF16 and ds[-1].rule == "lower"


def test_fp32_list_casts_lower_inputs_up():
    x = torch.randn(2, 5, dtype=BF16)
    out, ds = run(TORCHLIKE, lambda: F.softmax(x, -1))
    assert out.dtype == F32
    assert ds[-1].rule == "fp32" and ds[-1].casts == 1


def test_promote_casts_to_widest_input():
    a, b = torch.randn(2, 2, dtype=BF16), torch.randn(2, 2)
    out, ds = run(TORCHLIKE, lambda: torch.cat([a, b]))
    assert out.dtype == F32 and ds[-1].rule == "promote" and ds[-1].casts == 1
    out, _ = run(TORCHLIKE, lambda: torch.stack([a, a]))
    assert out.dtype == BF16


def test_lower_and_fp32_lists_win_over_promote():
    a, b = torch.randn(3), torch.randn(3, dtype=BF16)
    out, ds = run(HMPLIKE, lambda: a * b)  # mul: lower list and promote list
    assert out.dtype == BF16 and ds[-1].rule == "lower"
    out, ds = run(HMPLIKE, lambda: b / b)  # truediv: fp32 list and promote list
    assert out.dtype == F32 and ds[-1].rule == "fp32"


def test_unlisted_ops_torch_passthrough_vs_hmp_first_input():
    a, b = torch.randn(3, dtype=BF16), torch.randn(3)
    out, ds = run(TORCHLIKE, lambda: torch.sub(a, b))
    assert out.dtype == F32 and ds[-1].rule == "passthrough"  # torch's own type promotion
    out, ds = run(HMPLIKE, lambda: torch.sub(a, b))
    assert out.dtype == BF16 and ds[-1].rule == "first_input"  # HMP: precision of the 1st input
    out, _ = run(HMPLIKE, lambda: torch.sub(b, a))
    assert out.dtype == F32


def test_float64_and_integer_tensors_are_never_cast():
    lin = nn.Linear(4, 3).double()
    out, ds = run(TORCHLIKE, lambda: lin(torch.randn(2, 4, dtype=F64)))
    assert out.dtype == F64 and ds[-1].casts == 0
    # The decision says what really ran: float64, not the lower list's bf16 (and tune never picks it).
    assert (ds[-1].rule, ds[-1].compute, ds[-1].forced) == (Rule.FLOAT64, F64, True)
    emb = nn.Embedding(10, 4)
    idx = torch.tensor([1, 2])
    out, _ = run(HMPLIKE, lambda: emb(idx) + 0)
    assert idx.dtype == torch.long and out.dtype == F32
    ints = torch.ones(2, 2, dtype=torch.long)
    out, ds = run(TORCHLIKE, lambda: torch.matmul(ints, ints))
    assert out.dtype == torch.long and (ds[-1].rule, ds[-1].compute, ds[-1].reason) == (
        Rule.NO_FLOAT, None, "no floating-point input")


def test_explicit_dtype_argument_wins():
    x = torch.randn(2, 5, dtype=BF16)
    out, ds = run(TORCHLIKE, lambda: torch.softmax(x, -1, dtype=torch.float64))
    assert out.dtype == F64 and ds[-1].reason == "explicit dtype= wins" and ds[-1].casts == 0
    assert ds[-1].rule is Rule.EXPLICIT_DTYPE and ds[-1].forced


def test_inplace_and_out_follow_the_policy_rule():
    a, b = torch.randn(3, dtype=BF16), torch.randn(3)
    _, ds = run(TORCHLIKE, lambda: a.add_(b))
    assert ds[-1].rule is Rule.INPLACE and ds[-1].reason == "in-place: not autocast" and ds[-1].casts == 0
    a2, b2 = torch.randn(3, dtype=BF16), torch.randn(3)
    _, ds = run(HMPLIKE, lambda: a2.add_(b2))
    assert ds[-1].rule is Rule.INPLACE_FIRST_INPUT and ds[-1].casts == 1
    x = torch.randn(3, dtype=BF16)
    x2 = x.clone()

    def iadd():
        nonlocal x2
        x2 += torch.randn(3)
        return x2

    out, ds = run(HMPLIKE, iadd)
    assert out.dtype == BF16 and ds[-1].op == "add_" and ds[-1].rule is Rule.INPLACE_FIRST_INPUT
    dst = torch.empty(2, 3)
    w = torch.randn(3, 4)
    _, ds = run(TORCHLIKE, lambda: torch.matmul(torch.randn(2, 4), w.t(), out=dst))
    assert dst.dtype == F32 and ds[-1].rule is Rule.OUT and ds[-1].reason == "out=: not autocast"
    assert all(d.forced for d in ds[-1:])


def test_disable_casts_turns_everything_off():
    lin = nn.Linear(4, 3)
    with PrecisionEngine(TORCHLIKE, BF16):
        with tuner.disable_casts():
            assert lin(torch.randn(2, 4)).dtype == F32
        assert lin(torch.randn(2, 4)).dtype == BF16
    with tuner.autocast("torch-cpu"):  # also the torch.autocast fast path
        with tuner.disable_casts():
            assert lin(torch.randn(2, 4)).dtype == F32


def test_verbose_logs_each_decision(caplog):
    lin = nn.Sequential(nn.Linear(4, 3))
    with caplog.at_level(logging.INFO, logger="tuner"):
        with tuner.autocast(TORCHLIKE, "bf16", verbose=True):
            lin(torch.randn(2, 4))
    assert any("linear#0" in r.getMessage() and "lower list" in r.getMessage() and "bf16" in r.getMessage()
               for r in caplog.records)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.inner = nn.Sequential(nn.Linear(4, 4), nn.ReLU())

    def forward(self, x):
        return torch.matmul(self.inner(self.fc(x)), self.fc.weight)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Block()
        self.b = Block()

    def forward(self, x):
        return self.b(self.a(x))


def test_every_op_call_is_attributed_to_its_module():
    net = Net()
    _, ds = run(TORCHLIKE, lambda: net(torch.randn(2, 4)), root=net)
    where = [(d.module, d.op) for d in ds]
    assert ("a.fc", "linear") in where and ("a.inner.0", "linear") in where and ("a.inner.1", "relu") in where
    assert ("a", "matmul") in where and ("b", "matmul") in where


def test_module_overrides_take_precedence_and_reach_children():
    net = Net()
    _, ds = run(TORCHLIKE, lambda: net(torch.randn(2, 4)), root=net, module_overrides={"a": F32})
    for d in ds:
        if d.module.startswith("a"):
            assert d.compute is F32, d
        if d.module == "b.fc":
            assert d.compute is BF16
    _, ds = run(TORCHLIKE, lambda: net(torch.randn(2, 4)), root=net, module_overrides={"*.inner.*": F32})
    assert {d.compute for d in ds if ".inner." in d.module} == {F32}
    assert {d.compute for d in ds if d.module.endswith(".fc")} == {BF16}
    # an override to the lower dtype wins over the FP32 list
    x = torch.randn(2, 3)
    sm = nn.Softmax(-1)
    _, ds = run(TORCHLIKE, lambda: sm(x), root=sm, module_overrides={"": BF16})
    assert ds[-1].compute is BF16
    assert (ds[-1].rule, ds[-1].reason, ds[-1].forced) == (Rule.MODULE, "module override: bf16", False)


def test_alias_hit_names_the_listed_op_and_is_not_forced():
    a, b = torch.randn(2, 3), torch.randn(3, 2)
    _, ds = run(Policy("seed", lower=frozenset({"__matmul__"})), lambda: a @ b)  # `a @ b` arrives as matmul
    assert ds[-1].rule is Rule.LOWER and ds[-1].reason == "lower list (as __matmul__)" and not ds[-1].forced


def test_instance_overrides_pick_one_call():
    net = Net()
    _, ds = run(TORCHLIKE, lambda: net(torch.randn(2, 4)), root=net,
                instance_overrides={("a", "matmul", 0): F32})
    got = {(d.module, d.op): d.compute for d in ds}
    assert got[("a", "matmul")] is F32 and got[("b", "matmul")] is BF16


def test_composite_python_functions_are_transparent():
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(2, 3, 8)
    _, ds = run(TORCHLIKE, lambda: mha(x, x, x), root=mha)
    ops = [d.op for d in ds]
    assert "linear" in ops and "multi_head_attention_forward" not in ops
    assert all(d.compute is BF16 for d in ds if d.op == "linear")


def test_backward_through_casts_keeps_fp32_gradients():
    net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))
    x, y = torch.randn(16, 6), torch.randn(16, 2)
    with tuner.autocast(TORCHLIKE, "bf16"):
        out = net(x)
        loss = F.mse_loss(out, y)
    assert out.dtype == BF16 and loss.dtype == F32
    loss.backward()
    assert all(p.grad is not None and p.grad.dtype == F32 for p in net.parameters())


def test_bf16_training_loop_reduces_loss_and_cache_is_not_stale():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    x = torch.randn(64, 4)
    y = x.sum(1, keepdim=True)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    losses = []
    with tuner.autocast(TORCHLIKE, "bf16", engine="python"):
        for _ in range(60):
            loss = F.mse_loss(net(x), y)
            opt.zero_grad()
            loss.backward()
            with tuner.disable_casts():
                opt.step()
            losses.append(loss.item())
    assert losses[-1] < 0.3 * losses[0]


def test_fp16_training_with_grad_scaler():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    x = torch.randn(32, 4)
    y = x.sum(1, keepdim=True)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    losses = []
    for _ in range(40):
        with tuner.autocast(TORCHLIKE, "fp16"):
            out = net(x)
            loss = F.mse_loss(out, y)
        assert out.dtype == torch.float16
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    assert all(p.dtype == F32 for p in net.parameters())
    assert losses[-1] < 0.5 * losses[0]


def test_hmp_style_process_wide_switch(tmp_path):
    lower = tmp_path / "lower.txt"
    lower.write_text("linear\n")
    fp32 = tmp_path / "fp32.txt"
    fp32.write_text("relu\n")
    tuner.convert(lower_list_path=lower, fp32_list_path=fp32)
    try:
        out = nn.Linear(3, 3)(torch.randn(2, 3))
        assert out.dtype == BF16
        assert torch.relu(out).dtype == F32
    finally:
        tuner.revert()
    assert nn.Linear(3, 3)(torch.randn(2, 3)).dtype == F32


def test_bad_dtype_and_policy_are_config_errors():
    with pytest.raises(ConfigError, match="unknown dtype"):
        tuner.autocast(TORCHLIKE, "int8")
    with pytest.raises(ConfigError, match="both"):
        Policy("x", lower=frozenset({"linear"}), fp32=frozenset({"linear"}))


@pytest.mark.parametrize("dtype,expected", [("bf16", BF16), ("bfloat16", BF16), (torch.bfloat16, BF16),
                                            ("fp16", torch.float16), ("half", torch.float16),
                                            (torch.float16, torch.float16)])
def test_dtype_aliases(dtype, expected):
    with tuner.autocast(TORCHLIKE, dtype):
        assert nn.Linear(2, 2)(torch.randn(1, 2)).dtype == expected


def test_torch_preset_fast_path_equals_engine_on_a_cnn():
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    x = torch.randn(2, 1, 8, 8)
    fast = tuner.autocast("torch-cpu")
    assert fast.engine is None  # delegates to torch.autocast
    with torch.no_grad():
        with fast:
            a = net(x)
        with tuner.autocast("torch-cpu", engine="python"):
            b = net(x)
    assert a.dtype == b.dtype == BF16 and torch.equal(a, b)

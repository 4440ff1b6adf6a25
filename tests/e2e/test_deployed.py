"""A trial runs exactly what is deployed: `mpt tune` then `tuner.load` on models whose structure used to split them.

Each model file is tuned by the CLI, loaded with `tuner.load` into a fresh model, and the loaded model must run,
give the bits the tuned model gave under the plan, and run every matmul in the dtype the plan says (an
ATen-level record: `tuner.measure.deployed.observe`).
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import tuner
from mpt_cli.main import main
from tuner.core.loader import load_user_model
from tuner.measure.deployed import observe, stored_as, weight_dtypes
from tuner.policy.plan import Plan

HEADER = """
import torch
from torch import nn
import torch.nn.utils.parametrize as P

X = torch.randn(64, 16, generator=torch.Generator().manual_seed(1))


def example_inputs():
    return (X[:8],)


def evaluate(model):
    with torch.no_grad():
        out = model(X)
        ref = build_model()(X)
    # in float64: the cosine of a bf16 output taken in its own dtype is off by 1e-3, the tolerance, and by how
    # much depends on the CPU's bf16 kernels
    return float(torch.nn.functional.cosine_similarity(out.double().flatten(), ref.double().flatten(), dim=0))
"""

# (a) the layers are in a ModuleList (never called) under a module that owns a fragile op: an FP32 island
MODULE_LIST = """
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(16, 16) for _ in range(3)])
        self.proto = nn.Parameter(torch.randn(4, 16))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        # a fragile op of the block's own, whose answer leaves no doubt on any CPU (issue 47): in bf16, x + 1000
        # rounds to a multiple of 4 and erases x (mostly below 2), and the output (x @ proto.t() in exact
        # arithmetic) collapses (cosine 0.34); in FP32 its error is 1e-4 of x. The layers' and the head's bf16
        # rounding costs the cosine 2e-5, a fiftieth of the tolerance, whatever the bf16 kernels: the plan keeps
        # the block's own ops. (The cdist of x + 1000 this was took its distances from ||a||^2 + ||b||^2 - 2ab
        # for 64 rows, 5% off in FP32 already: any bf16 layer moved that noise past the tolerance on AMX.)
        return (x + 1000.0) @ self.proto.t() - 1000.0 * self.proto.sum(-1)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.head = nn.Linear(4, 4)

    def forward(self, x):
        return self.head(self.block(x))


def build_model():
    torch.manual_seed(0)
    return Model().eval()
"""

# (a) the same with parametrized weights, and a child whose forward returns None (it keeps its result)
PARAMETRIZED = """
class Scale(nn.Module):
    def forward(self, w):
        return w * 0.5


class Keeper(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.kept = None

    def forward(self, x):
        self.kept = self.lin(x)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(16, 16) for _ in range(2)])
        for layer in self.layers:
            P.register_parametrization(layer, "weight", Scale())
        self.keeper = Keeper()
        self.register_buffer("eye", torch.eye(16))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        self.keeper(x)
        x = self.keeper.kept.float()
        return (x + 1000.0) @ self.eye - 1000.0  # fragile in bf16: the block stays FP32


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, x):
        return self.block(x)


def build_model():
    torch.manual_seed(0)
    return Model().eval()
"""

# (b) a module made per call inside forward (HF Mamba's ACT2FN["silu"](x)): not in named_modules()
FRESH_MODULE = """
class Mixer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, 16)
        self.out = nn.Linear(16, 4)
        self.register_buffer("eye", torch.eye(16))

    def forward(self, x):
        h = nn.SiLU()(self.inp(x))  # a new module per call
        return self.out((h + 1000.0) @ self.eye - 1000.0)  # fragile in bf16: the mixer stays FP32


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.mixer = Mixer()

    def forward(self, x):
        return self.mixer(x)


def build_model():
    torch.manual_seed(0)
    return Model().eval()
"""

# (c) PyTorch's fused nn.TransformerEncoder (eval mode, no grad: the fast path)
ENCODER = """
X = torch.randn(16, 6, 16, generator=torch.Generator().manual_seed(1))


def example_inputs():
    return (X[:2],)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.proto = nn.Parameter(torch.randn(4, 16))

    def forward(self, x):
        y = self.encoder(x)
        return torch.cdist(y + 1000.0, self.proto + 1000.0)


def build_model():
    torch.manual_seed(0)
    return Model().eval()
"""


# (d) a rotary embedding as every HF decoder writes it: its frequencies inside the model's own
# torch.autocast(enabled=False) region, so they run in FP32 under any plan (issue 33)
ROTARY = """
class Rotary(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", torch.randn(1, 16))

    def forward(self, x):
        with torch.autocast(x.device.type, enabled=False):
            return (x.float()[..., :1] @ self.inv_freq).cos()


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.rotary = Rotary()
        self.proto = nn.Parameter(torch.randn(4, 16))

    def forward(self, x):
        h = self.a(x)
        h = h * self.rotary(h)
        # a fragile op: bf16 rounding of 1000 + small swamps the signal, so the plan keeps it FP32
        return torch.cdist(h + 1000.0, self.proto + 1000.0)


def build_model():
    torch.manual_seed(0)
    return Model().eval()
"""

# (e) a module that turns torch.autocast on itself, in another dtype than the tune's
OWN_AUTOCAST = """
class Half(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(16, 16)

    def forward(self, x):
        with torch.autocast(x.device.type, dtype=torch.float16):
            return self.inner(x).float()


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.own = Half()
        self.proto = nn.Parameter(torch.randn(4, 16))

    def forward(self, x):
        return torch.cdist(self.own(self.a(x)) + 1000.0, self.proto + 1000.0)


def build_model():
    torch.manual_seed(0)
    return Model().eval()
"""

# (f) tensors no plan lowers: a complex spectral filter (a parameter), a complex128 phase (a dtype safetensors
# cannot name), a float64 constant, an int64 counter
OWN_DTYPES = """
class Spectral(nn.Module):
    def __init__(self):
        super().__init__()
        self.filt = nn.Parameter(torch.randn(9, dtype=torch.complex64))
        self.register_buffer("phase", torch.randn(9, dtype=torch.complex128))

    def forward(self, x):
        return torch.fft.irfft(torch.fft.rfft(x.float(), dim=-1) * self.filt * self.phase, n=16, dim=-1).float()


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.spec = Spectral()
        self.register_buffer("center", torch.randn(16, dtype=torch.float64))
        self.register_buffer("steps", torch.tensor(7))
        self.proto = nn.Parameter(torch.randn(4, 16))

    def forward(self, x):
        h = self.spec(self.a(x)) - self.center.float()
        return torch.cdist(h + 1000.0, self.proto + 1000.0)


def build_model():
    torch.manual_seed(0)
    return Model().eval()
"""


def _tune_and_load(tmp_path: Path, source: str, *extra: str):
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent(HEADER) + textwrap.dedent(source))
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["tune", str(path), "--out", str(out), "--no-latency", "--tolerance", "0.001",
                                    *extra])
    assert res.exit_code == 0, res.output
    user = load_user_model(str(path))
    plan = Plan.load(out / "plan.yaml")
    inputs = user.example_inputs()
    model = user.build()
    lowered = weight_dtypes(model, plan, inputs)
    with stored_as(model, lowered):
        trial = observe(model, plan, inputs)  # the model as the trials ran it
    trial.lowered = lowered
    loaded = tuner.load(user.build(), out)
    tuner.detach(loaded)
    deployed = observe(loaded, plan, inputs)
    return plan, trial, deployed, out, user


def _check_agree(plan: Plan, trial, deployed, model_fp32: frozenset[str] = frozenset()) -> None:
    assert torch.equal(trial.output, deployed.output)  # the loaded model gives the trial's bits
    assert trial.gemms == deployed.gemms
    fp32 = {i.module for i in plan.fp32_instances} | model_fp32
    for path, dtypes in deployed.gemms.items():  # every matmul where the plan says
        assert dtypes == ({torch.float32} if path in fp32 else {torch.bfloat16}), (path, dtypes)


@pytest.mark.plan
def test_module_list_under_an_fp32_island_runs_low_in_trial_plan_report_and_loaded_model(tmp_path):
    plan, trial, deployed, out, _ = _tune_and_load(tmp_path, MODULE_LIST)
    assert {i.module for i in plan.fp32_instances} == {"block"}  # the island: the block's own ops
    _check_agree(plan, trial, deployed)
    for k in range(3):  # the layers in the never-called ModuleList run (and are stored) in bf16
        assert deployed.gemms[f"block.layers.{k}"] == {torch.bfloat16}
        assert f"block.layers.{k}.weight" in trial.lowered
    report = (out / "report.md").read_text()
    assert "block" in report


@pytest.mark.plan
def test_parametrized_weights_and_a_forward_returning_none_load_and_agree(tmp_path):
    plan, trial, deployed, _, _ = _tune_and_load(tmp_path, PARAMETRIZED)
    # on any CPU: all-bf16's cosine is 0.000, the block's ops FP32 give 0.999997 (target 0.999)
    assert "block" in {i.module for i in plan.fp32_instances}
    _check_agree(plan, trial, deployed)
    assert deployed.gemms["block.layers.0"] == {torch.bfloat16}


@pytest.mark.plan
def test_a_module_made_inside_forward_counts_as_its_caller_and_the_plan_loads(tmp_path):
    plan, trial, deployed, out, _ = _tune_and_load(tmp_path, FRESH_MODULE)
    assert all("<" not in i.module for i in plan.fp32_instances)  # only modules named_modules() has
    # on any CPU: all-bf16's cosine is 0.76, the mixer's own ops FP32 give 0.999995 (target 0.999); of those the
    # silu stays (its input, mixer.inp's output, is bf16), the add and sub go (their inputs are FP32 then)
    assert {i.module for i in plan.fp32_instances} == {"mixer"}
    assert "silu" in {i.op for i in plan.fp32_instances}  # the fresh SiLU's call is the mixer's own
    _check_agree(plan, trial, deployed)
    res = CliRunner().invoke(main, ["check", str(out)])
    assert res.exit_code == 0, res.output


def test_fused_transformer_encoder_tuned_then_loaded_runs_and_matches(tmp_path):
    plan, trial, deployed, out, user = _tune_and_load(tmp_path, ENCODER)
    _check_agree(plan, trial, deployed)
    loaded = tuner.load(user.build(), out)
    with torch.no_grad():
        assert torch.equal(loaded(*user.example_inputs()), trial.output)


def test_an_encoder_layer_kept_fp32_as_an_island_loads_with_its_weights_as_the_trial_ran_them():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(2, 5, 16)
    plan = Plan(fp32_instances=(tuner.OpInstance("layers.0", "relu", 0),))  # the layer's own op: an island
    lowered = weight_dtypes(model, plan, (x,))
    with stored_as(model, lowered):
        trial = observe(model, plan, (x,))
    assert trial.gemms["layers.0.linear1"] == {torch.bfloat16}  # not the fused FP32 fast path
    assert "layers.0.linear1.weight" in lowered
    with torch.no_grad():  # what tuner.load builds: these weights stored lowered, the plan attached
        for name, p in model.named_parameters():
            p.data = p.data.to(lowered.get(name, p.dtype))
        tuner.attach(model, plan)
        assert torch.equal(model(x), trial.output)


@pytest.mark.parametrize("fresh", [True, False])
def test_tracker_names_an_unregistered_module_by_its_caller(fresh):
    from tuner.engine.function_mode import PrecisionEngine
    from tuner.policy.presets import load_preset

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.act = torch.nn.SiLU()

        def forward(self, x):
            return (torch.nn.SiLU() if fresh else self.act)(self.lin(x))

    seen = []
    model = M()
    with torch.no_grad(), PrecisionEngine(load_preset("torch-cpu"), torch.bfloat16, root=model,
                                          recorder=lambda d, *r: seen.append((d.module, d.op))):
        model(torch.randn(2, 4))
    assert ("" if fresh else "act", "silu") in seen


def test_a_models_own_autocast_off_region_is_kept_fp32_by_the_model_in_trials_report_and_load(tmp_path):
    plan, trial, deployed, out, user = _tune_and_load(tmp_path, ROTARY, "--metric", "rel-error", "--tolerance", "1e-6")
    kept = {i.module for i in plan.fp32_instances}
    assert kept and "rotary" not in kept  # an FP32 island of the plan's; the rotary is the model's own decision
    _check_agree(plan, trial, deployed, model_fp32=frozenset({"rotary"}))
    assert deployed.gemms["rotary"] == {torch.float32}
    loaded = tuner.load(user.build(), out)
    with torch.no_grad():
        assert torch.equal(loaded(*user.example_inputs()), trial.output)
    assert "kept FP32 by the model" in (out / "report.md").read_text()
    res = CliRunner().invoke(main, ["check", str(out)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["inspect", str(tmp_path / "model.py"), "--plan", str(out)])
    assert res.exit_code == 0, res.output
    rows = [line.split() for line in res.output.splitlines() if line.startswith("rotary ")]
    assert rows and all(r[-1] == "model" and r[3] == "fp32" for r in rows if r[1].startswith("matmul"))
    python = tuner.load(user.build(), out, engine="python")  # mpt's own engine keeps the region too
    tuner.detach(python)
    assert observe(python, plan, user.example_inputs()).gemms["rotary"] == {torch.float32}


def test_a_models_own_autocast_on_region_runs_as_torch_autocast_runs_it(tmp_path):
    plan, trial, deployed, out, user = _tune_and_load(tmp_path, OWN_AUTOCAST, "--metric", "rel-error",
                                                      "--tolerance", "1e-6")
    assert deployed.gemms["own.inner"] == trial.gemms["own.inner"] == {torch.float16}  # the model's dtype
    assert torch.equal(trial.output, deployed.output)
    res = CliRunner().invoke(main, ["inspect", str(tmp_path / "model.py"), "--plan", str(out)])
    assert res.exit_code == 0, res.output
    row = next(line.split() for line in res.output.splitlines() if line.startswith("own.inner "))
    assert row[3] == "fp16" and row[-1] == "model-ac"


def test_complex_float64_and_integer_tensors_are_kept_bit_for_bit_and_the_checkpoint_checks(tmp_path):
    plan, trial, deployed, out, user = _tune_and_load(tmp_path, OWN_DTYPES, "--metric", "rel-error",
                                                      "--tolerance", "1e-6")
    assert torch.equal(trial.output, deployed.output)
    loaded = tuner.load(user.build(), out)
    state = loaded.state_dict()
    want = user.build().state_dict()
    for name in ("spec.filt", "spec.phase", "center", "steps"):
        assert state[name].dtype == want[name].dtype and torch.equal(state[name], want[name]), name
    res = CliRunner().invoke(main, ["check", str(out), "--checkpoint"])
    assert res.exit_code == 0, res.output

"""The model's own autocast regions, whatever form they take, are claimed as they run deployed (issue 44).

transformers 5.17's rotary embedding opens `torch.autocast(enabled=False)` only when autocast is on at the call
(`maybe_autocast`): deployed (torch.autocast on) its matmul runs FP32, and mpt's engine, which measures the
report's claims and the search's candidates with autocast off, must give the model's code the same state, or it
claims the lower dtype for it. The rotary forwards are the releases' own (`tests.assets.rotary_releases`).
"""
from __future__ import annotations

import pytest
import torch

from tests.assets.rotary_releases import RELEASES, TinyDecoder, maybe_autocast
from tuner import OpInstance, Plan
from tuner.engine.function_mode import PrecisionEngine
from tuner.engine.regions import DeployedAutocast, deployed_autocast
from tuner.measure.deployed import gemm_mismatches, observe
from tuner.measure.recorded import record_plan
from tuner.policy.presets import load_preset
from tuner.policy.rules import Rule

PLANS = {
    "all-low": {},
    # an FP32 island lists every lower-precision op of its own, as a tuned plan does (`tuner.engine.native`)
    "island": {"fp32_instances": (OpInstance("layers.0", "matmul", 0), OpInstance("layers.0", "matmul", 1))},
    "rotary-island": {"fp32_instances": (OpInstance("rotary_emb", "mul", 0),)},
    "subtree": {"modules": (("layers.1", "fp32"),)},
}


def _model(release: str) -> tuple[TinyDecoder, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return TinyDecoder(release).eval(), (torch.randint(0, 32, (2, 6)),)


@pytest.mark.parametrize(("release", "plan_name", "dtype"),
                         [(r, p, "bf16") for r in RELEASES for p in PLANS] + [(r, "all-low", "fp16") for r in RELEASES])
def test_the_claims_are_what_the_deployed_model_runs(release, plan_name, dtype):
    model, inputs = _model(release)
    plan = Plan(dtype=dtype, preset="torch-cpu", **PLANS[plan_name])
    record = record_plan(model, plan, inputs)
    seen = observe(model, plan, inputs)
    assert gemm_mismatches(seen.gemms, record.claimed, record.tolerated) == []
    assert record.shares.flop_share == pytest.approx(seen.flop_share, abs=1e-9)
    if release != "5.24":  # the release's own block keeps the rotary matmul FP32, deployed and claimed
        assert seen.gemms["rotary_emb"] == {torch.float32} and record.claimed["rotary_emb"] == {torch.float32}


def test_the_conditional_block_is_no_candidate_and_the_model_sees_autocast_on():
    """Under `as_deployed` the model's code reads torch.autocast as deployed: on in low code, off in an FP32
    subtree; the engine's own calls still decide (the linears low, a kept one FP32), and a matmul in the model's
    FP32 block is the model's (`Rule.MODEL_FP32`), not the lists'."""
    model, inputs = _model("5.17")
    seen: dict[str, bool] = {}
    rules: dict[tuple[str, str, int], tuple[Rule, torch.dtype | None]] = {}

    def record(d, *rest) -> None:
        rules[(d.module, d.op, d.index)] = (d.rule, d.compute)

    hooks = [m.register_forward_pre_hook(lambda m, a, p=p: seen.__setitem__(p, torch.is_autocast_enabled("cpu")))
             for p, m in model.named_modules()]
    overrides = {("layers.0", "matmul", 0): torch.float32}
    with torch.no_grad(), PrecisionEngine(load_preset("torch-cpu"), torch.bfloat16, root=model, recorder=record,
                                          module_overrides={"layers.1": torch.float32},
                                          instance_overrides=overrides, as_deployed=True):
        model(*inputs)
    for h in hooks:
        h.remove()
    assert not torch.is_autocast_enabled("cpu")
    assert seen[""] and seen["rotary_emb"] and seen["layers.0.q"] and seen["layers.0"]
    assert not seen["layers.1"] and not seen["layers.1.q"]
    assert rules[("rotary_emb", "matmul", 0)] == (Rule.MODEL_FP32, torch.float32)
    assert rules[("layers.0.q", "linear", 0)] == (Rule.LOWER, torch.bfloat16)
    assert rules[("layers.0", "matmul", 0)] == (Rule.INSTANCE, torch.float32)
    assert rules[("layers.1.q", "linear", 0)] == (Rule.MODULE, torch.float32)


def test_deployed_autocast_follows_the_path_tuner_load_takes():
    model, _ = _model("5.17")
    pol = load_preset("torch-cpu")
    native = deployed_autocast(model, pol, torch.bfloat16, {"layers.1": torch.float32},
                               {("layers.0", "matmul", 0): torch.float32})
    assert native == DeployedAutocast("cpu", torch.bfloat16, frozenset({"layers.1"}))  # the island keeps it on
    assert native.on_at("layers.0") and not native.on_at("layers.1") and not native.on_at("layers.1.up")
    scoped = deployed_autocast(model, pol, torch.bfloat16, {"layers.1": torch.float16},
                               {("layers.0", "matmul", 0): torch.float32})
    assert scoped == DeployedAutocast("cpu", torch.bfloat16, frozenset({"layers.0", "layers.1"}))
    assert deployed_autocast(model, load_preset("hmp"), torch.bfloat16, {}, {}) is None  # mpt's engine deployed
    cuda = deployed_autocast(model, load_preset("torch-cuda"), torch.float16, {}, {}, device="cuda")
    assert cuda == DeployedAutocast("cuda", torch.float16)


def test_maybe_autocast_is_5_17s():
    """The asset's helper behaves as 5.17's: a block only where autocast is on (or asked for)."""
    assert isinstance(maybe_autocast("cpu", enabled=False), type(maybe_autocast("meta")))
    with torch.autocast("cpu", torch.bfloat16):
        assert isinstance(maybe_autocast("cpu", enabled=False), torch.autocast)


class OnlyUnderAutocast(torch.nn.Module):
    """A region that exists only when autocast is on, and opens it on: its head computes in float16 then."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        if torch.is_autocast_enabled("cpu"):
            with torch.autocast("cpu", dtype=torch.float16):
                return self.head(h).float()
        return self.head(h)


def test_a_region_that_exists_only_under_autocast_is_claimed_as_it_runs():
    torch.manual_seed(0)
    model, inputs = OnlyUnderAutocast().eval(), (torch.randn(4, 8),)
    plan = Plan(dtype="bf16", preset="torch-cpu")
    record, seen = record_plan(model, plan, inputs), observe(model, plan, inputs)
    assert gemm_mismatches(seen.gemms, record.claimed, record.tolerated) == []
    assert record.claimed["head"] == seen.gemms["head"] == {torch.float16}


def test_inspect_shows_the_conditional_block_as_the_model_keeps_it():
    """`mpt inspect` runs its policy pass as deployed too: the 5.17 rotary matmul is the model's FP32."""
    from tuner.measure.inspection import inspect_model

    model, inputs = _model("5.17")
    records = {(r.module, r.op, r.index): r for r in inspect_model(model, inputs, "torch-cpu").records}
    rotary = records[("rotary_emb", "matmul", 0)]
    assert rotary.rule is Rule.MODEL_FP32 and rotary.dtype == "fp32"
    assert records[("layers.0.q", "linear", 0)].dtype == "bf16"


class OtherDeviceBlock(torch.nn.Module):
    """An FP32 block opened for CUDA in a model that runs on the CPU: it changes nothing for CPU ops."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", enabled=False):
            return self.b(self.a(x))


@pytest.mark.filterwarnings("ignore:.*CUDA is not available")
def test_a_block_for_another_device_is_claimed_as_torch_autocast_runs_it():
    """Once limits.md's: the engine took it for the model's own FP32 block while the CPU ops in it ran low.
    With the engine's forward under torch.autocast("cpu") as deployed, CPU autocast stays on in it."""
    torch.manual_seed(0)
    model, inputs = OtherDeviceBlock().eval(), (torch.randn(4, 8),)
    plan = Plan(dtype="bf16", preset="torch-cpu")
    record, seen = record_plan(model, plan, inputs), observe(model, plan, inputs)
    assert gemm_mismatches(seen.gemms, record.claimed, record.tolerated) == []
    assert record.claimed["a"] == seen.gemms["a"] == {torch.bfloat16}

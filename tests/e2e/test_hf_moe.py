"""transformers' MoE decoders (Mixtral, Qwen2-MoE) in their default experts implementation, zero-code (issue 44).

transformers 5 runs the experts as `torch._grouped_mm`, which torch.autocast does not lower: the report claimed
100% of matmul FLOPs low with the experts (most of them) in FP32. Now the tune lowers them, the report's share is
the ATen share of the loaded model, and a plan that keeps one layer's experts FP32 runs exactly those FP32.
"""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.utils._python_dispatch import TorchDispatchMode

import tuner
from tests.cli.test_bad_input import mpt
from tuner.core.hf import build_hf_model
from tuner.core.inputs import ModelInputs
from tuner.measure.deployed import GEMMS, verify
from tuner.measure.flops import aten_flops, first_tensor
from tuner.policy.plan import OpInstance, Plan
from tuner.report.checkpoint import plan_pass

transformers = pytest.importorskip("transformers")
if not hasattr(torch, "_grouped_mm"):
    pytest.skip("this torch has no torch._grouped_mm", allow_module_level=True)

DECODER = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=64, max_position_embeddings=32)
ARCHS = {"mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2)),
         "qwen2-moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                       dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                            shared_expert_intermediate_size=32, decoder_sparse_step=1))}
BATCH = 8  # mpt's default --batch-size: the report's shares are counted on the data's first batch


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe")
    for name, (config, model, extra) in ARCHS.items():
        torch.manual_seed(0)
        built = getattr(transformers, model)(getattr(transformers, config)(**DECODER, **extra)).eval()
        assert built.config._experts_implementation == "grouped_mm"  # transformers' default: what users run
        built.save_pretrained(root / name)
    ids = torch.randint(2, 96, (12, 10), generator=torch.Generator().manual_seed(1))
    save_file({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, root / "data.safetensors")
    return root


def _aten(model: torch.nn.Module, inputs: dict) -> tuple[float, set[torch.dtype]]:
    """One forward: the share of matmul/conv FLOPs that ATen ran in bf16/fp16, and the dtypes `_grouped_mm` ran in."""
    flops: dict[bool, int] = {True: 0, False: 0}
    grouped: set[torch.dtype] = set()

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if name in GEMMS:
                dtype = first_tensor(out).dtype
                flops[dtype in (torch.bfloat16, torch.float16)] += aten_flops(name, args, kwargs or {}, out)
                if name == "_grouped_mm":
                    grouped.add(dtype)
            return out

    with torch.no_grad(), Count():
        model(**inputs)
    return flops[True] / (flops[True] + flops[False]), grouped


@pytest.mark.parametrize("arch,dtype", [("mixtral", "bf16"), ("qwen2-moe", "fp16")])
def test_moe_experts_are_tuned_low_and_the_report_claims_what_the_loaded_model_runs(runner, folders, tmp_path,
                                                                                    arch, dtype):
    out, data = tmp_path / "out", folders / "data.safetensors"
    res = mpt(runner, "tune", f"hf:{folders / arch}", "--data", data, "--dtype", dtype, "--out", out, "-q",
              "--no-latency", "--max-evals", "3")
    assert res.exit_code in (0, 3), res.output
    report = json.loads((out / "report.json").read_text())
    inputs = {k: v[:BATCH] for k, v in load_file(data).items()}
    share, grouped = _aten(tuner.load(f"hf:{folders / arch}", out), inputs)
    assert report["low_precision_flop_share"] == pytest.approx(share, abs=1e-9)
    plan = Plan.load(out / "plan.yaml")
    if not any(i.op == "_grouped_mm" for i in plan.fp32_instances):
        assert grouped == {plan.torch_dtype}  # the experts ran low (they ran FP32: a share of 33-66%, claimed 100%)

    # one layer's experts kept FP32 by the plan: those, and only those, run FP32; claims and ATen agree
    experts = "model.layers.0.mlp.experts"
    kept = dataclasses.replace(plan, fp32_instances=tuple(sorted(
        {*plan.fp32_instances, OpInstance(experts, "_grouped_mm", 0), OpInstance(experts, "_grouped_mm", 1)})))
    model, calls = build_hf_model(folders / arch), ModelInputs(kwargs=inputs)
    planned = plan_pass(model, kept, calls)
    seen = verify(model, kept, calls, planned.lowered, planned.claimed, planned.tolerated,
                  share=planned.shares.flop_share)  # NotAsClaimed where the deployed forward differs from the claims
    assert planned.claimed[experts] == seen.gemms[experts] == {torch.float32}
    assert seen.gemms["model.layers.1.mlp.experts"] == {kept.torch_dtype}
    assert f"{experts}.gate_up_proj" not in planned.lowered
    assert planned.lowered["model.layers.1.mlp.experts.gate_up_proj"] == kept.torch_dtype
    assert 0 < seen.flop_share < share

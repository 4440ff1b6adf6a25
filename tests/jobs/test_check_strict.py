"""`mpt check` is as strict as `mpt tune`: every evaluation on the model as built, typed plan values, bounded files.

- An `evaluate` that changes the model gets it rebuilt before the next evaluation (the keeper `mpt tune` uses),
  so its change cannot pass for noise and widen the margin a plan may miss the target by.
- Every value of a plan has its type checked: a quoted `"false"` is an error naming the key, never true.
- A plan (config, op list) larger than a few MB or nested deeper than any plan mpt writes is exit 2 at once.
"""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml

from mpt_cli import exitcodes
from mpt_cli.main import main
from tuner.core.errors import ConfigError
from tuner.core.loader import load_user_model
from tuner.core.yamlio import MAX_DEPTH, MAX_FILE_BYTES
from tuner.policy.plan import Plan
from tuner.workspace.modelref import model_ref_for

# One linear y = w * x: 1.01 in FP32, 1.0078125 in bf16 (x rounds to bf16), so the metric
# 1 - |y - 1.01| * K is 1.0 in FP32 and 0.99 under an all-bf16 plan: 1% below a 0.1% tolerance's target.
# evaluate() nudges the bias by +0.02 on odd calls and back on even ones: without a rebuild between the
# baseline's evaluations they spread over ~0.09, which passed for noise and passed the plan.
MUTATING = textwrap.dedent('''
    import torch
    from torch import nn

    K = 0.01 / (1.01 - 1.0078125)
    _calls = []


    def build_model():
        model = nn.Linear(1, 1)
        with torch.no_grad():
            model.weight.fill_(1.0)
            model.bias.zero_()
        return model


    def example_inputs():
        return (torch.full((1, 1), 1.01),)


    def evaluate(model):
        _calls.append(1)
        with torch.no_grad():
            y = float(model(torch.full((1, 1), 1.01)).float())
            model.bias.add_(0.02 if len(_calls) % 2 else -0.02)  # the model this evaluate leaves is changed
        return 1.0 - abs(y - 1.01) * K
''')


def plan_folder(tmp_path: Path, source: str, **metrics) -> Path:
    """An all-bf16 plan for `source`, written as `mpt tune` would (its ModelRef included)."""
    model_file = tmp_path / "model.py"
    model_file.write_text(source)
    out = tmp_path / "plan"
    out.mkdir()
    user = load_user_model(str(model_file))
    ref = model_ref_for(user, out, build=None, eval=None, inputs=None, model=user.build())
    Plan(dtype="bf16", preset="torch-cpu", metrics={"tolerance": 0.001, "absolute": False,
                                                    "lower_is_better": False, **metrics},
         model=ref).save(out / "plan.yaml")
    return out


def edit_plan(out: Path, change) -> None:
    data = yaml.safe_load((out / "plan.yaml").read_text())
    change(data)
    (out / "plan.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def test_a_mutating_evaluate_is_rebuilt_between_baseline_runs_and_its_plan_fails(runner, tmp_path):
    out = plan_folder(tmp_path, MUTATING)
    res = runner.invoke(main, ["check", str(out), "--json"])
    assert res.exit_code == exitcodes.TARGET_NOT_MET, res.output
    data = json.loads(res.stdout)
    # Every evaluation saw the model as built: a deterministic baseline of 1.0, no noise to hide behind.
    assert data["baseline"] == pytest.approx(1.0) and data["spread"] == 0.0 and data["margin"] == 0.0
    assert data["metric"] == pytest.approx(0.99) and data["target"] == pytest.approx(0.999)
    assert data["status"] == "fail"


def test_a_mutating_evaluate_does_not_change_a_passing_verdict(runner, tmp_path):
    out = plan_folder(tmp_path, MUTATING.replace("1.01", "1.0"))  # 1.0 is exact in bf16: the plan meets it
    res = runner.invoke(main, ["check", str(out), "--json"])
    assert res.exit_code == exitcodes.OK, res.output
    data = json.loads(res.stdout)
    assert data["baseline"] == data["metric"] == pytest.approx(1.0) and data["spread"] == 0.0


def test_check_with_the_checkpoint_evaluates_the_loaded_model(runner, tmp_path):
    """The last evaluation (a checkpoint loaded into the keeper's model) needs no rebuild after it."""
    out = tmp_path / "out"
    model = Path(__file__).parents[2] / "examples" / "digits_sensor.py"
    res = runner.invoke(main, ["tune", str(model), "--out", str(out), "--no-latency"])
    assert res.exit_code == exitcodes.OK, res.output
    res = runner.invoke(main, ["check", str(out), "--checkpoint", "--json"])
    assert res.exit_code == exitcodes.OK, res.output
    assert json.loads(res.stdout)["weights"] == "checkpoint"


# --- plan values are type-checked ------------------------------------------------------------------------------
def test_a_quoted_false_is_an_error_naming_the_key_not_true(runner, tmp_path):
    out = plan_folder(tmp_path, MUTATING)
    edit_plan(out, lambda d: d["metrics"].update(lower_is_better="false"))
    res = runner.invoke(main, ["check", str(out)])
    assert res.exit_code == exitcodes.USAGE, res.output
    assert "metrics.lower_is_better: expected true or false, found str 'false'" in res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize("change, named", [
    (lambda d: d["metrics"].update(absolute="no"), "metrics.absolute: expected true or false"),
    (lambda d: d["metrics"].update(tolerance="0.01"), "metrics.tolerance: expected a number, found str"),
    (lambda d: d["metrics"].update(noise=True), "metrics.noise: expected a number, found bool"),
    (lambda d: d["metrics"].update(tuned="0.9"), "metrics.tuned: expected a number or null"),
    (lambda d: d["metrics"].update(evaluations=-1), "metrics.evaluations: expected an integer >= 0"),
    (lambda d: d["metrics"].update(candidates=2.5), "metrics.candidates: expected an integer >= 0"),
    (lambda d: d["metrics"].update(status="done"), "metrics.status: expected one of ok, not_met"),
    (lambda d: d["metrics"].update(stopped=1), "metrics.stopped: expected null or one of max_evals"),
    (lambda d: d["metrics"].update(lower_is_beter=True), "metrics.lower_is_beter: unknown key; did you mean "
                                                         "'lower_is_better'?"),
    (lambda d: d.update(metrics=[1]), "metrics: expected a mapping, found list"),
    (lambda d: d.update(version=True), "version: expected an integer, found bool"),
    (lambda d: d.update(dtype=16), "dtype: expected a string, found int"),
    (lambda d: d.update(preset=["torch-cpu"]), "preset: expected a string, found list"),
    (lambda d: d.update(checkpoint_sha256=12), "checkpoint_sha256: expected a string, found int"),
    (lambda d: d.update(lower=["linear", 3]), "lower[1]: expected an op name (a string), found int"),
    (lambda d: d.update(modules={"lin": 16}), "modules.lin: expected a module path and a dtype name"),
    (lambda d: d.update(fp32_instances={"module": "x"}), "fp32_instances: expected a list, found dict"),
    (lambda d: d.update(fp32_instances=[{"module": "", "op": "linear", "index": True}]),
     "fp32_instances[0].index: expected an integer >= 0, found bool"),
    (lambda d: d.update(fp32_instances=[{"module": "", "op": 7, "index": 0}]),
     "fp32_instances[0].op: expected a string, found int"),
    (lambda d: d.update(fp32_instances=[{"module": None, "op": "linear", "index": 0}]),
     "fp32_instances[0].module: expected a module path (a string), found NoneType"),
    (lambda d: d["model"].update(weights=5), "model.weights: expected a string, found int"),
])
def test_every_plan_value_has_its_type_checked(tmp_path, change, named):
    out = plan_folder(tmp_path, MUTATING)
    edit_plan(out, change)
    with pytest.raises(ConfigError) as info:
        Plan.load(out)
    assert named in str(info.value)


def test_an_unquoted_number_is_still_a_module_path(tmp_path):
    (tmp_path / "plan.yaml").write_text("dtype: bf16\nmodules:\n  0: fp32\nfp32_instances:\n"
                                        "- {module: 1, op: linear, index: 0}\n")
    plan = Plan.load(tmp_path / "plan.yaml")
    assert plan.modules == (("0", "fp32"),) and plan.fp32_instances[0].module == "1"


def test_a_plan_mpt_writes_reads_back(tmp_path):
    metrics = {"baseline": 0.9, "tuned": None, "target": 0.89, "tolerance": 0.01, "absolute": False,
               "lower_is_better": True, "noise": 0.0, "evaluations": 3, "candidates": 2, "status": "not_met",
               "stopped": "max_evals"}
    Plan(metrics=metrics, modules=(("a", "fp32"),)).save(tmp_path / "plan.yaml")
    assert dict(Plan.load(tmp_path / "plan.yaml").metrics) == metrics


# --- bounded size and depth ------------------------------------------------------------------------------------
def test_a_deeply_nested_plan_is_exit_2(runner, tmp_path):
    out = plan_folder(tmp_path, MUTATING)
    with open(out / "plan.yaml", "a") as fh:
        fh.write("extra: " + "[" * 5000 + "]" * 5000 + "\n")
    res = runner.invoke(main, ["check", str(out)])
    assert res.exit_code == exitcodes.USAGE, res.output
    assert f"nested more than {MAX_DEPTH} levels deep at line" in res.output and "Traceback" not in res.output
    block = "".join(f"{' ' * i}k:\n" for i in range(1500)) + " " * 1500 + "v: 1\n"  # block style, as deep
    (out / "plan.yaml").write_text(block)
    res = runner.invoke(main, ["check", str(out)])
    assert res.exit_code == exitcodes.USAGE and "nested more than" in res.output, res.output


def test_the_deepest_plan_mpt_writes_is_read(tmp_path):
    (tmp_path / "plan.yaml").write_text("a:\n" + "".join(f"{'  ' * i}- b{i}:\n" for i in range(1, 7))
                                        + "  " * 7 + "- 1\n")
    with pytest.raises(ConfigError, match="a: unknown key"):  # parsed; only the key is wrong
        Plan.load(tmp_path / "plan.yaml")


def test_a_plan_over_the_size_bound_is_exit_2_before_it_is_parsed(runner, tmp_path):
    out = plan_folder(tmp_path, MUTATING)
    line = "# " + "x" * 1021 + "\n"
    with open(out / "plan.yaml", "a") as fh:
        fh.write(line * (MAX_FILE_BYTES // len(line) + 1))
    res = runner.invoke(main, ["check", str(out)])
    assert res.exit_code == exitcodes.USAGE, res.output
    assert "MB is larger than mpt reads in a plan, config or op list (4 MB at most)" in res.output


def test_a_config_or_op_list_over_the_bounds_is_exit_2(runner, tmp_path):
    model = str(Path(__file__).parents[2] / "examples" / "digits_sensor.py")
    deep = tmp_path / "deep.yaml"
    deep.write_text("model: " + "[" * 200 + "]" * 200 + "\n")
    res = runner.invoke(main, ["tune", "--config", str(deep), "--out", str(tmp_path / "o")])
    assert res.exit_code == exitcodes.USAGE and "nested more than" in res.output, res.output
    big = tmp_path / "ops.txt"
    big.write_text("linear\n" * (MAX_FILE_BYTES // 7 + 1))
    res = runner.invoke(main, ["inspect", model, "--lower-list", str(big)])
    assert res.exit_code == exitcodes.USAGE and "larger than mpt reads" in res.output, res.output

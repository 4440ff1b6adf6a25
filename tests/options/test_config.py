"""YAML configs: validation (every problem at once), precedence, relative paths, and the shipped configs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from mpt_cli import exitcodes
from mpt_cli.main import main
from tuner.core.errors import ConfigError
from tuner.options.config import SCHEMA, load_config, validate_config

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "configs").glob("*.yaml"))
ASSETS = Path(__file__).parents[1] / "assets"

MODEL = (ASSETS / "valid_model.py").read_text()


def write_config(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def problems(text: str, tmp_path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(write_config(tmp_path / "c.yaml", text), SCHEMA)
    return info.value.errors


def tuned_settings(out: Path) -> dict:
    """What a tune run in `out` was run with, from its plan.yaml."""
    plan = yaml.safe_load((out / "plan.yaml").read_text())
    return {"dtype": plan["dtype"], **plan["metrics"]}


# --- the shipped configs ------------------------------------------------------------------------------------

def test_a_config_ships_for_each_bundled_example():
    examples = {p.stem for p in (ROOT / "examples").glob("digits_*.py")}
    assert examples and examples <= {p.stem for p in SHIPPED}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_config_validates(path):
    raw = yaml.safe_load(path.read_text())
    assert raw["version"] == 1
    assert path.read_text().lstrip().startswith("#"), "shipped configs are commented"
    for command in ("tune", "inspect", "check"):
        values = load_config(path, SCHEMA, command=command)
        assert Path(values["model"]).is_file(), values["model"]  # relative to the config file, not the cwd
    assert Path(load_config(path, SCHEMA)["out"]).parent == ROOT / "runs"


def test_shipped_config_tune_then_check_end_to_end(runner, tmp_path, monkeypatch):
    pytest.importorskip("sklearn")
    monkeypatch.chdir(tmp_path)  # paths in the config are relative to it, not to the working directory
    config = ROOT / "configs" / "digits_sensor.yaml"
    out = tmp_path / "run"
    res = runner.invoke(main, ["tune", "--config", str(config), "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    assert "target met" in res.stdout
    plan = yaml.safe_load((out / "plan.yaml").read_text())
    assert plan["dtype"] == "bf16" and plan["preset"] == "torch-cpu" and plan["metrics"]["tolerance"] == 0.01
    assert [i["module"] for i in plan["fp32_instances"]] == ["calib"]
    res = runner.invoke(main, ["check", str(out), "--config", str(config)])
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("check: PASS")


# --- validation ------------------------------------------------------------------------------------------

def test_every_problem_reported_at_once(tmp_path):
    found = problems("version: 1\nmodel: 3\ntolerence: 0.1\nlower-is-better: true\ndtype: fp8\npreset: hmpp\n"
                     "max_evals: ten\ntolerance: 2\nabsolute: 'yes'\n", tmp_path)
    assert len(found) == 8, found
    text = "\n".join(found)
    assert "model: expected a path (string), found 3 (int)" in text
    assert "tolerence: unknown key; did you mean 'tolerance'?" in text
    assert "lower-is-better: unknown key; config keys use underscores: write 'lower_is_better'" in text
    assert "dtype: expected one of bf16, fp16, bfloat16, float16, half, found 'fp8'" in text
    assert "preset: unknown preset 'hmpp'; did you mean hmp" in text
    assert "max_evals: expected an integer, found 'ten' (str)" in text
    assert "absolute: expected true or false, found 'yes' (str)" in text
    assert "tolerance: a relative tolerance must be below 1" in text


@pytest.mark.parametrize("text,fragment", [
    ("version: 1\ntolerance: -0.1\n", "tolerance: expected a number >= 0, found -0.1"),
    ("version: 1\ntolerance: .nan\n", "tolerance: expected a number, found nan"),
    ("version: 1\ntolerance: '1%'\n", "tolerance: expected a number, found '1%' (str)"),
    ("version: 1\nmax_evals: 1\n", "max_evals: expected an integer >= 2, found 1"),
    ("version: 1\nmax_evals: 2.5\n", "max_evals: expected an integer, found 2.5"),
    ("version: 1\ntime_budget: 0\n", "time_budget: expected a number > 0, found 0"),
    ("version: 1\ndevice: tpu\n", "device: expected one of cpu, cuda, found 'tpu'"),
    ("version: 1\nresume: true\noverwrite: true\n", "give one of them, not both"),
    ("version: 1\nmodule: {encoder: fp64x}\n", "module.encoder: unknown dtype 'fp64x'"),
    ("version: 1\nmodule: fp32\n", "module: expected a mapping of module path to dtype"),
    ("version: 1\nout: [a, b]\n", "out: expected a path (string), found a list"),
    ("version: 2\n", "config version 2 is newer than this mpt reads (1); upgrade mpt-tuner"),
    ("version: 0\n", "version: expected 1, found 0"),
    ("model: m.py\n", "version: missing; a config starts with `version: 1`"),
    ("version: '1'\n", "version: expected an integer, found '1' (str)"),
    ("version: 1\nmodel_fn: make\n", "model_fn: unknown key; did you mean"),
    ("version: 1\nmax_eval: 3\n", "max_eval: unknown key; did you mean 'max_evals'"),
    ("version: 1\nmodle: m.py\n", "'model'"),
    ("version: 1\n42: x\n", "42: unknown key"),
])
def test_single_problem_messages(tmp_path, text, fragment):
    assert any(fragment in p for p in problems(text, tmp_path)), problems(text, tmp_path)


def test_absolute_tolerance_may_be_large(tmp_path):
    values = load_config(write_config(tmp_path / "c.yaml", "version: 1\ntolerance: 5\nabsolute: true\n"), SCHEMA)
    assert values == {"tolerance": 5, "absolute": True}


def test_not_a_mapping_empty_malformed_and_unsafe(tmp_path):
    with pytest.raises(ConfigError, match="a config is a YAML mapping"):
        load_config(write_config(tmp_path / "a.yaml", "- model.py\n- bf16\n"), SCHEMA)
    with pytest.raises(ConfigError, match="the config is empty"):
        load_config(write_config(tmp_path / "b.yaml", "# nothing\n"), SCHEMA)
    with pytest.raises(ConfigError, match=r"malformed YAML at line \d+, column \d+"):
        load_config(write_config(tmp_path / "c.yaml", "version: 1\nmodel: [model.py\n"), SCHEMA)
    # yaml.safe_load only: python tags are rejected, never run.
    marker = tmp_path / "pwned"
    with pytest.raises(ConfigError, match="malformed YAML"):
        load_config(write_config(tmp_path / "d.yaml",
                                 f"version: 1\nmodel: !!python/object/apply:os.system ['touch {marker}']\n"), SCHEMA)
    assert not marker.exists()
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.yaml", SCHEMA)


def test_paths_relative_to_the_config_file(tmp_path):
    cfg = write_config(tmp_path / "ci" / "mpt.yaml",
                       "version: 1\nmodel: ../src/model.py:make\neval: metrics.py:score\ninputs: batch\n"
                       "build: other.py:make\n"
                       "out: ../runs/bf16\nplan: /abs/plan.yaml\njunit: reports/mpt.xml\nlower_list: ops.txt\n")
    values = load_config(cfg, SCHEMA)
    assert values["model"] == str(tmp_path / "src" / "model.py") + ":make"
    assert values["build"] == str(tmp_path / "ci" / "other.py") + ":make"
    assert values["eval"] == str(tmp_path / "ci" / "metrics.py") + ":score"
    assert values["inputs"] == "batch"  # a bare function name is not a path
    assert values["out"] == str(tmp_path / "runs" / "bf16")
    assert values["plan"] == "/abs/plan.yaml"
    assert values["junit"] == str(tmp_path / "ci" / "reports" / "mpt.xml")
    assert values["lower_list"] == str(tmp_path / "ci" / "ops.txt")


def test_each_command_takes_its_own_keys(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", "version: 1\nmodel: m.py\nmax_evals: 5\ntop: 3\njunit: r.xml\n")
    assert set(load_config(cfg, SCHEMA, command="tune")) == {"model", "max_evals"}
    assert set(load_config(cfg, SCHEMA, command="inspect")) == {"model", "top"}
    assert set(load_config(cfg, SCHEMA, command="check")) == {"model", "junit"}
    assert set(validate_config({"version": 1}, SCHEMA, command="tune")) == set()
    assert all(k == k.lower() and "-" not in k for k in SCHEMA)


# --- through the CLI ------------------------------------------------------------------------------------

def test_config_error_exits_2_with_the_list_not_a_traceback(runner, tmp_path):
    cfg = write_config(tmp_path / "c.yaml", "version: 1\ntolerence: 0.1\ndtype: fp8\n")
    for command in ("tune", "inspect", "check"):
        res = runner.invoke(main, [command, "--config", str(cfg)])
        assert res.exit_code == exitcodes.USAGE, res.output
        assert res.stderr.startswith(f"mpt: error: {cfg}: 2 problems:")
        assert "did you mean 'tolerance'?" in res.stderr and "Traceback" not in res.stderr


def test_malformed_yaml_through_the_cli(runner, tmp_path):
    cfg = write_config(tmp_path / "c.yaml", "version: 1\n  model: x\n")
    res = runner.invoke(main, ["tune", "--config", str(cfg)])
    assert res.exit_code == exitcodes.USAGE and "malformed YAML at line 2" in res.stderr


def test_precedence_defaults_config_flags(runner, tmp_path, monkeypatch):
    write_config(tmp_path / "project" / "model.py", MODEL)
    cfg = write_config(tmp_path / "project" / "ci" / "tune.yaml",
                       "version: 1\nmodel: ../model.py\ntolerance: 0.2\nmax_evals: 5\nout: ../runs/a\nquiet: true\n")
    monkeypatch.chdir(tmp_path)  # the config's paths do not depend on the working directory
    res = runner.invoke(main, ["tune", "--config", str(cfg)])
    assert res.exit_code == 0, res.output
    out = tmp_path / "project" / "runs" / "a"
    header = tuned_settings(out)
    assert header["tolerance"] == 0.2 and header["dtype"] == "bf16"  # config value; default dtype
    assert "eval " not in res.stdout and "target met" in res.stdout  # quiet: true from the config

    res = runner.invoke(main, ["tune", "--config", str(cfg), "--tolerance", "0.05", "--dtype", "fp16",
                               "--out", "b"])
    assert res.exit_code == 0, res.output
    header = tuned_settings(tmp_path / "b")  # a command-line path is relative to the working directory
    assert header["tolerance"] == 0.05 and header["dtype"] == "fp16"


def test_model_argument_wins_over_config_and_is_optional_with_it(runner, tmp_path):
    write_config(tmp_path / "model.py", MODEL)
    write_config(tmp_path / "other.py", MODEL.replace("nn.Linear(4, 2)", "nn.Linear(4, 3)"))
    cfg = write_config(tmp_path / "c.yaml", "version: 1\nmodel: model.py\n")
    res = runner.invoke(main, ["inspect", "--config", str(cfg), "--json"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["inspect", str(tmp_path / "other.py"), "--config", str(cfg), "--json"])
    assert res.exit_code == 0, res.output
    assert '"module": "2"' in res.stdout
    res = runner.invoke(main, ["inspect", "--config", str(write_config(tmp_path / "d.yaml", "version: 1\n"))])
    assert res.exit_code == exitcodes.USAGE and "missing MODEL.py" in res.stderr


def test_inspect_config_and_flags(runner, tmp_path):
    write_config(tmp_path / "model.py", MODEL)
    cfg = write_config(tmp_path / "c.yaml", "version: 1\nmodel: model.py\ndtype: fp16\npreset: hmp-o1\n"
                                            "module: {'0': fp32}\njson: true\ntop: 1\n")
    res = runner.invoke(main, ["inspect", "--config", str(cfg)])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["summary"]["dtype"] == "fp16" and len(data["records"]) == 1
    res = runner.invoke(main, ["inspect", "--config", str(cfg), "--dtype", "bf16"])
    assert json.loads(res.stdout)["summary"]["dtype"] == "bf16"


def test_check_config_reads_out(runner, tmp_path):
    write_config(tmp_path / "model.py", MODEL)
    cfg = write_config(tmp_path / "ci" / "mpt.yaml",
                       "version: 1\nmodel: ../model.py\nout: ../runs/bf16\njunit: ../reports/mpt.xml\n")
    assert runner.invoke(main, ["tune", "--config", str(cfg), "-q"]).exit_code == 0
    res = runner.invoke(main, ["check", "--config", str(cfg)])
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("check: PASS")
    assert (tmp_path / "reports" / "mpt.xml").is_file()


def test_check_takes_no_tolerance_from_a_config(tmp_path):
    """A config's `tolerance` is the tune's: `mpt check --config` judges by the plan's (a loose config value
    made a broken model PASS); only --tolerance on check's command line overrides it."""
    path = write_config(tmp_path / "c.yaml", "version: 1\ntolerance: 0.5\nout: runs/x\n")
    assert load_config(path, SCHEMA, command="tune")["tolerance"] == 0.5
    assert "tolerance" not in load_config(path, SCHEMA, command="check")
    assert load_config(path, SCHEMA, command="check")["out"].endswith("runs/x")

"""Options are defined once (cli/options.py): the config schema is derived from the click parameters,
a config key and its flag mean the same thing, and library errors are rendered with the flag's name."""
from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
import yaml

from mpt_cli import exitcodes
from mpt_cli.main import main
from mpt_cli.options import PARAMS, config_schema
from tuner.options.config import check_options, validate_config
from tuner.core.errors import ConfigError

ASSETS = Path(__file__).parents[1] / "assets"
MODEL = (ASSETS / "valid_model.py").read_text()
SCHEMA = config_schema(main.commands.values())
CONFIGURED = [c for c in main.commands.values() if any(p.name == "config_path" for p in c.params)]


def test_every_command_but_presets_takes_a_config():
    assert sorted(c.name for c in CONFIGURED) == ["check", "inspect", "tune"]


@pytest.mark.parametrize("command", CONFIGURED, ids=lambda c: c.name)
def test_schema_keys_are_exactly_the_commands_parameters(command):
    params = [p for p in command.params if p.name not in ("config_path", "help")]
    keys = {p.config_key for p in params}
    assert len(keys) == len(params), "one key per parameter"
    assert keys == {k for k, key in SCHEMA.items() if command.name in key.commands}
    for p in params:
        if isinstance(p, click.Option):  # a key is its flag's long name with underscores
            assert f"--{p.config_key.replace('_', '-')}" in p.opts, (p.config_key, p.opts)


def test_schema_kinds_come_from_the_click_types():
    assert SCHEMA["model"].kind == "model-file" and SCHEMA["build"].kind == "function"
    assert SCHEMA["max_evals"].kind == "int" and SCHEMA["max_evals"].minimum == 3
    assert SCHEMA["time_budget"].kind == "number" and SCHEMA["time_budget"].exclusive_min
    assert SCHEMA["device"].choices == ("cpu", "cuda") and SCHEMA["resume"].kind == "bool"
    assert SCHEMA["out"].kind == "path" and SCHEMA["out"].commands == {"tune", "check"}
    assert SCHEMA["model"].commands == {"tune", "inspect", "check"}
    assert "version" not in SCHEMA and "config" not in SCHEMA and "lists_only" not in SCHEMA


def test_each_option_is_defined_once():
    keys = [p.key for p in PARAMS]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize("command", ["tune", "inspect", "check", "presets"])
def test_every_option_has_help(runner, command):
    for p in main.commands[command].params:
        if isinstance(p, click.Option):
            assert p.help, f"{command} {p.opts} has no help"
    if command != "presets" and command != "inspect":
        res = runner.invoke(main, [command, "--help"])
        assert "--device" in res.output and "Where to run the model" in res.output


def test_model_and_build_mean_the_same_everywhere():
    tune, check = main.commands["tune"], main.commands["check"]
    assert [p.config_key for p in tune.params if isinstance(p, click.Argument)] == ["model"]
    assert [p.config_key for p in check.params if isinstance(p, click.Argument)] == ["out"]
    model_option = next(p for p in check.params if p.name == "model_file")
    assert model_option.opts == ["--model"]
    for command in main.commands.values():
        assert not any("--model-file" in getattr(p, "opts", ()) for p in command.params)
        build = [p for p in command.params if getattr(p, "config_key", None) == "build"]
        assert command.name == "presets" or build[0].opts == ["--build"]


# --- a config key and its flag give the same result ------------------------------------------------------------

@pytest.fixture
def model(tmp_path) -> Path:
    path = tmp_path / "model.py"
    path.write_text(MODEL + "\n\ndef make():\n    return build_model()\n")
    return path


@pytest.mark.parametrize("yaml_line,flags", [
    ("dtype: fp16", ["--dtype", "fp16"]),
    ("preset: hmp-o1", ["--preset", "hmp-o1"]),
    ("module: {'0': fp32}", ["--module", "0=fp32"]),
    ("top: 1", ["--top", "1"]),
    ("build: make", ["--build", "make"]),
])
def test_config_key_and_flag_agree(runner, tmp_path, model, yaml_line, flags):
    by_flag = runner.invoke(main, ["inspect", str(model), "--json", *flags])
    assert by_flag.exit_code == 0, by_flag.output
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"version: 1\nmodel: model.py\njson: true\n{yaml_line}\n")
    by_key = runner.invoke(main, ["inspect", "--config", str(cfg)])
    assert by_key.exit_code == 0, by_key.output
    assert json.loads(by_key.stdout) == json.loads(by_flag.stdout)


def test_a_bad_value_says_the_same_as_flag_and_key(runner, tmp_path, model):
    by_flag = runner.invoke(main, ["tune", str(model), "--max-evals", "1", "--out", str(tmp_path / "o")])
    assert by_flag.exit_code == exitcodes.USAGE
    assert by_flag.stderr.startswith("mpt: error: --max-evals: expected an integer >= 3, found 1")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("version: 1\nmax_evals: 1\n")
    by_key = runner.invoke(main, ["tune", str(model), "--config", str(cfg)])
    assert by_key.exit_code == exitcodes.USAGE
    assert by_key.stderr.startswith(f"mpt: error: {cfg}: max_evals: expected an integer >= 3, found 1")
    assert not (tmp_path / "o").exists()


def test_rules_over_several_options_name_the_flags(runner, tmp_path, model):
    res = runner.invoke(main, ["tune", str(model), "--tolerance", "5", "--resume", "--overwrite"])
    assert res.exit_code == exitcodes.USAGE
    assert "--tolerance: a relative tolerance must be below 1 (0.01 = 1%), found 5.0; set --absolute" in res.stderr
    assert "--resume and --overwrite: give one of them, not both" in res.stderr
    assert "2 problems" in res.stderr
    res = runner.invoke(main, ["inspect", str(model), "--preset", "hmpp"])
    assert res.exit_code == exitcodes.USAGE and "--preset: unknown preset 'hmpp'; did you mean hmp" in res.stderr


def test_the_library_speaks_keys():
    with pytest.raises(ConfigError) as info:
        check_options({"max_evals": 1, "tolerance": 5.0, "absolute": False}, SCHEMA)
    assert info.value.fields == ("max_evals", "tolerance")
    assert info.value.errors[0] == "max_evals: expected an integer >= 3, found 1"
    assert "set `absolute`" in info.value.errors[1]
    with pytest.raises(ConfigError) as info:
        validate_config({"version": 1, "max_eval": 3, "top": 0}, SCHEMA)
    assert info.value.fields == ("max_eval", "top")


def test_check_takes_the_model_file_from_flag_or_key(runner, tmp_path, model):
    out = tmp_path / "run"
    assert runner.invoke(main, ["tune", str(model), "--out", str(out), "-q"]).exit_code == 0
    plan = out / "plan.yaml"
    data = yaml.safe_load(plan.read_text())
    del data["model"]  # a plan that does not say which model it was made for
    plan.write_text(yaml.safe_dump(data))
    res = runner.invoke(main, ["check", str(out)])
    assert res.exit_code == exitcodes.USAGE and "--model: " in res.stderr
    assert runner.invoke(main, ["check", str(out), "--model", str(model)]).exit_code == 0
    cfg = tmp_path / "c.yaml"
    cfg.write_text("version: 1\nmodel: model.py\nout: run\n")
    res = runner.invoke(main, ["check", "--config", str(cfg)])
    assert res.exit_code == 0, res.output

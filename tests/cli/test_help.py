"""A tool that is pleasant to use: every option has help, verbose=True is visible, train.py keeps shipped files."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from mpt_cli.main import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(main.commands))
def test_every_option_and_argument_has_help(name):
    command = main.commands[name]
    for param in command.params:
        if getattr(param, "hidden", False):
            continue
        assert (getattr(param, "help", None) or "").strip(), f"mpt {name}: {param.name} has no help"
    shown = CliRunner().invoke(main, [name, "--help"])
    assert shown.exit_code == 0 and "Examples:" in shown.output


def test_model_file_is_refused_with_the_option_and_key_that_replace_it(tmp_path):
    res = CliRunner().invoke(main, ["check", "mpt-out", "--model-file", "m.py"])
    assert res.exit_code == 2 and "--model" in res.output
    config = tmp_path / "mpt.yaml"
    config.write_text("version: 1\nmodel_file: m.py\nout: mpt-out\n")
    res = CliRunner().invoke(main, ["check", "--config", str(config)])
    assert res.exit_code == 2 and "model" in res.output.replace("model_file", "")


VERBOSE = """
import torch, tuner
{setup}
model = torch.nn.Sequential(torch.nn.Linear(4, 4))
with tuner.autocast("torch-cpu", "bf16", model=model, verbose=True):
    model(torch.randn(2, 4))
with tuner.autocast("torch-cpu", "bf16", verbose=True):   # a second block adds no second handler
    model(torch.randn(2, 4))
"""


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)


def test_verbose_is_visible_without_logging_setup():
    done = _run(VERBOSE.format(setup=""))
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "linear#0" in line]
    assert len(lines) == 2 and all(line.startswith("tuner: 0  linear#0") for line in lines), done.stderr
    assert "lower list" in lines[0] and done.stdout == ""


def test_verbose_follows_a_configured_logging_setup():
    setup = "import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout, format='LOG %(message)s')"
    done = _run(VERBOSE.format(setup=setup))
    assert done.returncode == 0, done.stderr
    assert "tuner:" not in done.stderr  # no handler of ours beside the user's
    assert sum("linear#0" in line and line.startswith("LOG ") for line in done.stdout.splitlines()) == 2


@pytest.mark.slow
def test_train_script_is_deterministic_and_never_overwrites_unasked(tmp_path):
    shipped = {p: p.read_bytes() for p in (ROOT / "examples" / "weights").glob("*.safetensors")}
    train = [sys.executable, str(ROOT / "examples" / "train.py"), "digits_sensor", "--epochs", "2"]
    first = subprocess.run([*train, "--out", str(tmp_path / "a")], capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    again = subprocess.run([*train, "--out", str(tmp_path / "a")], capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and "--overwrite" in again.stderr  # an existing file is refused
    second = subprocess.run([*train, "--out", str(tmp_path / "b")], capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    name = "digits_sensor.safetensors"
    assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()  # byte for byte
    assert {p: p.read_bytes() for p in shipped} == shipped  # the tracked weights are untouched


def test_top_level_help_names_the_hf_folder_and_the_built_in_metrics():
    shown = CliRunner().invoke(main, ["--help"])
    assert shown.exit_code == 0 and "hf:DIR" in shown.output and "--metric" in shown.output
    tune = CliRunner().invoke(main, ["tune", "--help"])
    assert 'tuner.load("hf:DIR", "mpt-out")' in tune.output

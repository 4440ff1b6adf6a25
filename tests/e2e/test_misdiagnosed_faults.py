"""Faults that came out in the wrong class (issue 17, item 8), each through the CLI on a tiny model.

- example_inputs() of the wrong shape or dtype, or made under a leaked `torch.set_default_dtype`, fails in FP32
  too: the user's code (exit 4 naming example_inputs), not "the tuned plan cannot run on this machine" (exit 2);
- example_inputs() on the meta device: exit 4 naming it, not an internal error;
- a `torch.jit.script` root or submodule: refused with one line (exit 2), not an internal error;
- `--out` removed or the journal replaced during the run: exit 2 naming the path, not an internal error.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from mpt_cli import exitcodes
from mpt_cli.main import main
from tuner.core.errors import OutputError
from tuner.workspace.journal import Journal, RunFingerprint

HEAD = """\
import os, shutil
import torch
from torch import nn
"""
BUILD = """\
def build_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
"""
EVAL = """\
@torch.no_grad()
def evaluate(model):
    return 1.0 - 0.0 * float(model(torch.ones(3, 4)).sum())
"""


def model_file(tmp_path: Path, *, build: str = BUILD, inputs: str = "", evaluate: str = EVAL) -> Path:
    path = tmp_path / "m.py"
    path.write_text("\n".join(textwrap.dedent(p) for p in (HEAD, build, inputs, evaluate)))
    return path


def tune(runner, model: Path, out: Path):
    res = runner.invoke(main, ["tune", str(model), "--out", str(out), "-q", "--no-latency"])
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise AssertionError(f"mpt raised instead of exiting: {res.exception!r}\n{res.output}")
    return res


def error_line(res, code: int) -> str:
    assert res.exit_code == code, f"exit {res.exit_code}, expected {code}\n{res.output}"
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr, res.stderr
    return res.stderr.splitlines()[0]


@pytest.mark.parametrize("inputs, says", [
    ("def example_inputs():\n    return (torch.ones(3, 5),)\n", "shapes cannot be multiplied"),
    ("def example_inputs():\n    return (torch.ones(3, 4, dtype=torch.long),)\n", "Long"),
    ("def example_inputs():\n    torch.set_default_dtype(torch.float64)\n    return (torch.ones(3, 4),)\n", "Double"),
], ids=["wrong-shape", "int64", "leaked-default-dtype"])
def test_example_inputs_the_model_cannot_take_is_the_users_code(runner, tmp_path, inputs, says):
    first = error_line(tune(runner, model_file(tmp_path, inputs=inputs), tmp_path / "out"), exitcodes.USER_CODE)
    assert first.startswith("mpt: error: forward raised RuntimeError: "), first
    assert says in first and "it fails in FP32 too" in first and "example_inputs()" in first, first
    assert "cannot run on this machine" not in first, first


def test_example_inputs_on_the_meta_device_is_exit_4(runner, tmp_path):
    inputs = "def example_inputs():\n    return (torch.ones(3, 4, device='meta'),)\n"
    first = error_line(tune(runner, model_file(tmp_path, inputs=inputs), tmp_path / "out"), exitcodes.USER_CODE)
    assert "example_inputs() returned 1 tensor(s) on the meta device" in first, first


@pytest.mark.parametrize("build, where", [
    ("def build_model():\n    torch.manual_seed(0)\n"
     "    return torch.jit.script(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval())\n",
     "the model itself"),
    ("class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
     "        self.a = torch.jit.script(nn.Linear(4, 8))\n        self.b = nn.Linear(8, 2)\n"
     "    def forward(self, x):\n        return self.b(self.a(x))\n"
     "def build_model():\n    torch.manual_seed(0)\n    return Net().eval()\n", "(a)"),
], ids=["root", "submodule"])
def test_a_jit_scripted_model_is_refused_in_one_line(runner, tmp_path, build, where):
    res = tune(runner, model_file(tmp_path, build=build), tmp_path / "out")
    first = error_line(res, exitcodes.USAGE)
    assert "torch.jit.script module" in first and where in first, first
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_out_removed_during_the_run_is_exit_2_naming_it(runner, tmp_path):
    out = tmp_path / "out"
    evaluate = f"""\
_N = [0]
@torch.no_grad()
def evaluate(model):
    _N[0] += 1
    if _N[0] == 2:  # the second baseline run: the journal already has its header and first line
        shutil.rmtree({str(out)!r})
    return 1.0 - 0.0 * float(model(torch.ones(3, 4)).sum())
"""
    first = error_line(tune(runner, model_file(tmp_path, evaluate=evaluate), out), exitcodes.USAGE)
    assert f"cannot write the journal {out / 'journal.jsonl'}" in first, first
    assert f"`out` {out} was removed" in first or f"--out {out} was removed" in first, first


def test_a_journal_that_cannot_be_written_is_an_output_error(tmp_path):
    fingerprint = RunFingerprint(source="0" * 64, weights="0" * 64)
    journal = Journal(tmp_path / "journal.jsonl", fingerprint, resume=False)
    (tmp_path / "journal.jsonl").unlink()
    (tmp_path / "journal.jsonl").mkdir()  # replaced by a folder during the run
    with pytest.raises(OutputError, match="the journal was removed or replaced"):
        journal.append("trial-1", {"metric": 1.0})

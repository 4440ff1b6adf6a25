"""Bad input and faults, through the CLI: a one-line error, a documented exit code, nothing lost.

Each case runs `mpt` through click's CliRunner and checks the exit code
(cli/exitcodes.py) and the message on stderr; none may show a Python
traceback unless --debug was given.
"""
from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

from mpt_cli import exitcodes
from mpt_cli.main import main

ASSETS = Path(__file__).parents[1] / "assets"
OVERFLOW = ASSETS / "fp16_overflow.py"

# A valid model file; tests replace one function at a time.
TEMPLATE = (ASSETS / "valid_model.py").read_text()


def model_file(tmp_path: Path, replace: dict[str, str] | None = None, *, name: str = "model.py",
               drop: tuple[str, ...] = (), extra: str = "") -> Path:
    """TEMPLATE with some functions replaced (`{"evaluate": "def evaluate(model): ..."}`) or dropped."""
    blocks = TEMPLATE.split("\n\n\n")
    out = []
    for block in blocks:
        fn = block.split("(", 1)[0].replace("def ", "").strip() if block.startswith("def ") else None
        if fn in drop:
            continue
        if fn and replace and fn in replace:
            block = textwrap.dedent(replace[fn]).strip("\n")
        out.append(block)
    path = tmp_path / name
    path.write_text("\n\n\n".join(out).rstrip("\n") + "\n" + extra)
    return path


def line_of(path: Path, marker: str) -> int:
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if marker in line:
            return i
    raise AssertionError(marker)


def mpt(runner, *args):
    res = runner.invoke(main, [str(a) for a in args])
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise AssertionError(f"mpt raised instead of exiting: {res.exception!r}\n{res.output}")
    return res


def assert_error(res, code: int, *fragments: str) -> str:
    """Exit code `code`, every fragment in stderr, and no traceback. Returns stderr."""
    err = res.stderr
    assert res.exit_code == code, f"exit {res.exit_code}, expected {code}\n{res.output}"
    assert "Traceback" not in err, err
    assert err.startswith("mpt: error: "), err
    for f in fragments:
        assert f in err, f"{f!r} not in {err!r}"
    return err


def tune(runner, tmp_path, model, *args):
    return mpt(runner, "tune", model, "--out", tmp_path / "out", "-q", *args)


# --- the model file ---------------------------------------------------------------------------------------

def test_model_file_missing(runner, tmp_path):
    res = tune(runner, tmp_path, tmp_path / "nope.py")
    assert_error(res, exitcodes.USAGE, "model file not found", "nope.py")
    assert not (tmp_path / "out").exists()  # nothing created before the inputs are checked


def test_a_missing_file_is_bad_input_on_every_command_and_in_the_help(runner, tmp_path):
    """A path that is not there is bad input (2), not an error in the user's code (4): the code and the
    exit-code table in `mpt --help` agree."""
    good = model_file(tmp_path)
    assert tune(runner, tmp_path, good).exit_code == exitcodes.OK
    for args in (["inspect", tmp_path / "nope.py"], ["check", tmp_path / "out", "--model", tmp_path / "nope.py"],
                 ["tune", good, "--out", tmp_path / "o2", "--eval", "metric.py:score"]):
        assert_error(mpt(runner, *args), exitcodes.USAGE, "not found")
    shown = mpt(runner, "--help").output
    assert f"{exitcodes.USAGE}    bad usage" in shown and "model file or function not found" in shown


def test_a_folder_given_as_the_model_file_names_the_fix(runner, tmp_path, monkeypatch):
    """An output folder of a tune suggests `mpt inspect MODEL --plan DIR` with the model file its plan records;
    a save_pretrained folder suggests `hf:DIR`; `hf:DIR/config.json` asks for the folder. One line, exit 2."""
    monkeypatch.chdir(tmp_path)
    model_file(tmp_path, name="net.py")
    (tmp_path / "runs" / "m").mkdir(parents=True)
    (tmp_path / "runs" / "m" / "plan.yaml").write_text("version: 1\ndtype: bf16\nmodel:\n  file: ../../net.py\n")
    (tmp_path / "hf-bertcls").mkdir()
    (tmp_path / "hf-bertcls" / "config.json").write_text('{"architectures": ["BertForSequenceClassification"]}')
    cases = {("inspect", "runs/m"): "runs/m is the output folder of mpt tune (it holds plan.yaml), not a model "
                                    "file; inspect the model under its plan with: mpt inspect net.py --plan runs/m",
             ("tune", "hf-bertcls"): "hf-bertcls holds config.json; for a folder saved with save_pretrained pass "
                                     "hf:hf-bertcls",
             ("tune", "hf:hf-bertcls/config.json"): "not a file in it: pass the folder: hf:hf-bertcls",
             ("inspect", "hf:hf-bertcls/config.json"): "pass the folder: hf:hf-bertcls"}
    for (command, model), said in cases.items():
        err = assert_error(mpt(runner, command, model, *(["--out", "o"] if command == "tune" else [])),
                           exitcodes.USAGE, said)
        assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_model_file_not_python(runner, tmp_path):
    txt = tmp_path / "model.txt"
    txt.write_text("build_model = 1\n")
    assert_error(tune(runner, tmp_path, txt), exitcodes.USAGE, "must be a Python .py file")
    binary = tmp_path / "weights.py"
    binary.write_bytes(b"\x00\x01PK\x03\x04")
    assert_error(tune(runner, tmp_path, binary), exitcodes.USAGE, "not Python source")


def test_model_file_with_syntax_error(runner, tmp_path):
    path = model_file(tmp_path, extra="def broken(:\n    pass\n")
    assert_error(tune(runner, tmp_path, path), exitcodes.USER_CODE, "is not valid Python",
                 f"model.py:{line_of(path, 'def broken')}")


def test_model_file_raises_on_import(runner, tmp_path):
    path = model_file(tmp_path, extra="import numpy_that_is_not_installed\n")
    err = assert_error(tune(runner, tmp_path, path), exitcodes.USER_CODE, "importing model.py raised",
                       "ModuleNotFoundError", f"model.py:{line_of(path, 'numpy_that')}")
    assert len(err.strip().splitlines()) <= 2


@pytest.mark.parametrize("missing", ["build_model", "evaluate"])
def test_model_file_lacks_a_function(runner, tmp_path, missing):
    path = model_file(tmp_path, drop=(missing,))
    assert_error(tune(runner, tmp_path, path), exitcodes.USAGE, f"has no function '{missing}'", "found:")


def test_named_function_does_not_exist(runner, tmp_path):
    path = model_file(tmp_path)
    assert_error(tune(runner, tmp_path, f"{path}:make_net"), exitcodes.USAGE, "has no function 'make_net'",
                 "build_model")
    assert_error(tune(runner, tmp_path, path, "--eval", "score"), exitcodes.USAGE, "has no function 'score'")
    assert_error(mpt(runner, "inspect", path, "--inputs", "batch"), exitcodes.USAGE, "has no function 'batch'")


def test_build_model_returns_no_module(runner, tmp_path):
    path = model_file(tmp_path, {"build_model": "def build_model():\n    return {'weights': 1}\n"})
    assert_error(tune(runner, tmp_path, path), exitcodes.USER_CODE,
                 "build_model returned dict", "expected a torch.nn.Module", "model.py:")


def test_evaluate_raises_points_at_user_line_and_debug_shows_traceback(runner, tmp_path):
    path = model_file(tmp_path, {"evaluate": """\
        def evaluate(model):
            scores = {"top1": 0.9}
            return scores["top5"]
        """})
    line = line_of(path, 'scores["top5"]')
    res = tune(runner, tmp_path, path)
    err = assert_error(res, exitcodes.USER_CODE, "evaluate raised KeyError: 'top5'", f"(model.py:{line})",
                       "--debug")
    assert len(err.strip().splitlines()) <= 2
    res = mpt(runner, "--debug", "tune", path, "--out", tmp_path / "out2", "-q")
    assert res.exit_code == exitcodes.USER_CODE
    assert "Traceback (most recent call last)" in res.stderr and f'line {line}, in evaluate' in res.stderr


@pytest.mark.parametrize("command", ["tune", "inspect", "check"])
def test_debug_works_after_the_command_too(runner, tmp_path, command):
    """The error's own advice, followed literally (`mpt tune x.py --debug`), shows the traceback."""
    path = model_file(tmp_path, {"build_model": "def build_model():\n    raise ValueError('no weights here')\n"})
    line = line_of(path, "no weights here")
    target = {"tune": [path, "--out", tmp_path / "out"], "inspect": [path],
              "check": [tmp_path / "out", "--model", path]}[command]
    if command == "check":  # a plan to check, tuned from a model that builds
        assert tune(runner, tmp_path, model_file(tmp_path, name="good.py")).exit_code == exitcodes.OK
    plain = mpt(runner, command, *target)
    assert_error(plain, exitcodes.USER_CODE, "no weights here", "--debug")
    for args in ([command, *target, "--debug"], ["--debug", command, *target]):
        res = mpt(runner, *args)
        assert res.exit_code == exitcodes.USER_CODE, res.output
        assert "Traceback (most recent call last)" in res.stderr and f"line {line}, in build_model" in res.stderr


@pytest.mark.parametrize("value,fragment", [
    ("float('nan')", "evaluate returned nan for the FP32 model"),
    ("float('inf')", "evaluate returned inf for the FP32 model"),
    ("'high'", "evaluate returned str ('high'), expected a single number"),
    ("torch.tensor([0.9, 0.8, 0.7])", "evaluate returned a tensor with 3 elements"),
    ("None", "missing `return`?"),
])
def test_evaluate_returns_no_number(runner, tmp_path, value, fragment):
    path = model_file(tmp_path, {"evaluate": f"def evaluate(model):\n    return {value}\n"})
    assert_error(tune(runner, tmp_path, path), exitcodes.USER_CODE, fragment)


def test_evaluate_failing_in_a_trial_fails_that_trial_only(runner, tmp_path):
    # FP32 baseline fine, lower precision raises: the trial fails and the search goes on to the all-FP32 plan.
    path = model_file(tmp_path, {"evaluate": """\
        def evaluate(model):
            with torch.no_grad():
                out = model(torch.ones(3, 4))
            if out.dtype != torch.float32:
                raise RuntimeError("metric kernel needs float32")
            return 1.0
        """})
    res = mpt(runner, "tune", path, "--out", tmp_path / "out")
    assert res.exit_code in (exitcodes.OK, exitcodes.TARGET_NOT_MET), res.output
    assert "FAIL" in res.stdout and "evaluate raised RuntimeError: metric kernel needs float32" in res.stdout


def test_target_not_met_exit_code(runner, tmp_path):
    path = model_file(tmp_path, {"evaluate": """\
        CALLS = []


        def evaluate(model):
            CALLS.append(1)
            model(torch.ones(3, 4))
            return 1.0 if len(CALLS) == 1 else 0.5
        """})
    res = mpt(runner, "tune", path, "--out", tmp_path / "out")
    assert res.exit_code == exitcodes.TARGET_NOT_MET, res.output
    assert "target not met" in res.stdout
    assert (tmp_path / "out" / "plan.yaml").is_file()  # the all-FP32 plan is still written


def test_internal_error_exit_code(runner, tmp_path, monkeypatch):
    import importlib

    def bug(*args, **kwargs):
        raise RuntimeError("something mpt got wrong")

    monkeypatch.setattr(importlib.import_module("tuner.jobs.tune_run"), "tune_into_folder", bug)
    assert_error(tune(runner, tmp_path, model_file(tmp_path)), exitcodes.INTERNAL,
                 "internal error: RuntimeError: something mpt got wrong", "report it")


def test_ctrl_c_in_process_exits_130_and_keeps_the_journal(runner, tmp_path):
    path = model_file(tmp_path, {"evaluate": """\
        CALLS = []


        def evaluate(model):
            CALLS.append(1)
            if len(CALLS) == 2:  # the baseline's second run
                raise KeyboardInterrupt
            model(torch.ones(3, 4))
            return 1.0
        """})
    res = tune(runner, tmp_path, path)
    assert_error(res, exitcodes.INTERRUPTED, "interrupted", "--resume")
    lines = [json.loads(x) for x in (tmp_path / "out" / "journal.jsonl").read_text().splitlines()]
    assert [x.get("key") for x in lines if x["kind"] == "eval"] == ["baseline#1"]
    assert not list((tmp_path / "out").glob("*.tmp")) and not list((tmp_path / "out").glob(".*.tmp"))


# --- lower precision: NaN / inf ---------------------------------------------------------------------------

def test_fp16_overflow_is_seen_in_the_forward_and_costs_no_evaluation(runner, tmp_path):
    res = mpt(runner, "tune", OVERFLOW, "--dtype", "fp16", "--lower-is-better", "--absolute", "--tolerance",
              "0.05", "--out", tmp_path / "out")
    assert res.exit_code == exitcodes.OK, res.output
    trials = [line for line in res.stdout.splitlines() if line.startswith("eval") and " base " not in line]
    # the all-fp16 plan overflows on the example inputs: not evaluated; the first trial keeps `big` FP32 (the
    # range rule's plan: with the mul that reads its 1e6 output, FP32 anyway once `big` is)
    assert "the output overflows on the example inputs" in res.stdout
    assert len(trials) == 1 and "pass" in trials[0] and "big:linear#0" in trials[0]


def test_fp16_overflow_in_a_trial_fails_it_and_the_search_moves_on(runner, tmp_path):
    # the example inputs are scaled down so the forward does not overflow, evaluate's data still does
    path = tmp_path / "small_inputs.py"
    path.write_text(OVERFLOW.read_text() + "\n\ndef example_inputs():\n    return (_X * 1e-3,)\n")
    res = mpt(runner, "tune", path, "--dtype", "fp16", "--lower-is-better", "--absolute", "--tolerance",
              "0.05", "--out", tmp_path / "out")
    assert res.exit_code == exitcodes.OK, res.output
    trials = [line for line in res.stdout.splitlines() if line.startswith("eval") and " base " not in line]
    assert "FAIL" in trials[0] and ("metric is nan" in trials[0] or "metric is inf" in trials[0])
    assert any("pass" in t and "+1 FP32: big:linear#0" in t for t in trials[1:])  # the module that owns linear#0
    plan = (tmp_path / "out" / "plan.yaml").read_text()
    assert "module: big" in plan


def test_inspect_shows_which_op_overflowed_first(runner):
    res = mpt(runner, "inspect", OVERFLOW, "--dtype", "fp16", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["summary"]["first_nonfinite"] == "big:linear#0"
    res = mpt(runner, "inspect", OVERFLOW, "--dtype", "fp16")
    assert "first non-finite output (NaN/inf) at big:linear#0" in res.stdout
    res = mpt(runner, "inspect", OVERFLOW, "--dtype", "bf16", "--json")  # bf16's range is FP32's: no overflow
    assert json.loads(res.stdout)["summary"]["first_nonfinite"] is None


# --- op-list files ------------------------------------------------------------------------------------------

def test_op_list_unknown_names_and_duplicates(runner, tmp_path):
    lower = tmp_path / "bf16_ops.txt"
    lower.write_text("# my list\nmm\nmatmull\nmm\nconv2d\n")
    err = assert_error(mpt(runner, "inspect", OVERFLOW, "--lower-list", lower), exitcodes.USAGE,
                       "2 problems", "unknown op 'matmull'; did you mean matmul", "op 'mm' is listed twice")
    assert "bf16_ops.txt" in err


def test_op_in_both_lists(runner, tmp_path):
    lower, fp32 = tmp_path / "lower.txt", tmp_path / "fp32.txt"
    lower.write_text("linear\nmm\n")
    fp32.write_text("softmax\nlinear\n")
    assert_error(mpt(runner, "inspect", OVERFLOW, "--lower-list", lower, "--fp32-list", fp32), exitcodes.USAGE,
                 "op(s) in both", "linear")
    plan = tmp_path / "plan.yaml"
    plan.write_text("version: 1\ndtype: bf16\npreset: torch-cpu\nlower: [linear]\nfp32: [linear]\n")
    assert_error(mpt(runner, "inspect", OVERFLOW, "--plan", plan), exitcodes.USAGE,
                 "in both the lower-precision and the FP32 list: linear")


def test_op_list_missing_file(runner, tmp_path):
    assert_error(mpt(runner, "inspect", OVERFLOW, "--fp32-list", tmp_path / "nope.txt"), exitcodes.USAGE,
                 "op-list file not found")


def test_plan_from_a_newer_version(runner, tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text("version: 7\ndtype: bf16\npreset: torch-cpu\nfp32_instances: []\n")
    assert_error(mpt(runner, "inspect", OVERFLOW, "--plan", plan), exitcodes.USAGE,
                 "plan version 7 is newer than this mpt reads (1); upgrade mpt-tuner")


def test_plan_with_unknown_key_and_bad_dtype(runner, tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text("version: 1\ndtype: fp8\npreset: torch-cpu\nfp32_instance: []\n")
    assert_error(mpt(runner, "inspect", OVERFLOW, "--plan", plan), exitcodes.USAGE,
                 "fp32_instance: unknown key; did you mean 'fp32_instances'?")


# --- --out -----------------------------------------------------------------------------------------------

def test_out_is_a_file(runner, tmp_path):
    (tmp_path / "out").write_text("not a folder")
    assert_error(tune(runner, tmp_path, model_file(tmp_path)), exitcodes.USAGE, "is a file, not a folder")


def test_out_under_a_file(runner, tmp_path):
    (tmp_path / "f").write_text("")
    res = mpt(runner, "tune", model_file(tmp_path), "--out", tmp_path / "f" / "out", "-q")
    assert_error(res, exitcodes.USAGE, "cannot create --out")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root can write to any folder")
def test_out_unwritable_folder(runner, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o500)
    try:
        assert_error(tune(runner, tmp_path, model_file(tmp_path)), exitcodes.USAGE, "is not writable")
    finally:
        out.chmod(0o700)


def test_out_unwritable_folder_simulated(runner, tmp_path, monkeypatch):
    # The same check, for CI runners that run as root (where chmod does not stop writes): the lock file
    # is the first thing a run writes into --out.
    import tuner.workspace.folder

    real = os.open

    def fake_open(path, *args, **kwargs):
        if Path(path).name == tuner.workspace.folder.LOCK_NAME:
            raise PermissionError(13, "Permission denied")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(tuner.workspace.folder.os, "open", fake_open)
    assert_error(tune(runner, tmp_path, model_file(tmp_path)), exitcodes.USAGE,
                 "is not writable: Permission denied")


def test_out_holding_another_run_is_refused_without_resume_or_overwrite(runner, tmp_path):
    path = model_file(tmp_path)
    assert tune(runner, tmp_path, path).exit_code == 0
    before = (tmp_path / "out" / "plan.yaml").read_text()
    assert_error(tune(runner, tmp_path, path), exitcodes.USAGE, "already holds a run", "--resume", "--overwrite")
    assert (tmp_path / "out" / "plan.yaml").read_text() == before  # nothing touched
    assert tune(runner, tmp_path, path, "--overwrite").exit_code == 0
    assert tune(runner, tmp_path, path, "--resume").exit_code == 0
    assert_error(tune(runner, tmp_path, path, "--resume", "--overwrite"), exitcodes.USAGE, "not both")


def test_a_run_that_fails_before_its_first_trial_leaves_nothing_and_the_fixed_rerun_needs_no_flag(runner, tmp_path):
    """The fault in evaluate fixed, the same command runs: no journal, lock or manifest is left to refuse it
    (nor to be `--resume`d with the old settings); a folder the user made keeps their file and nothing else."""
    broken = model_file(tmp_path, {"evaluate": "def evaluate(model):\n    raise RuntimeError('boom')\n"})
    assert_error(tune(runner, tmp_path, broken), exitcodes.USER_CODE, "evaluate raised RuntimeError: boom")
    assert not (tmp_path / "out").exists()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    res = mpt(runner, "tune", broken, "--out", tmp_path / "mine", "-q")
    assert_error(res, exitcodes.USER_CODE, "boom")
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]
    fixed = model_file(tmp_path)
    assert tune(runner, tmp_path, fixed).exit_code == exitcodes.OK
    assert mpt(runner, "tune", fixed, "--out", tmp_path / "mine", "-q").exit_code == exitcodes.OK
    assert (tmp_path / "mine" / "notes.txt").read_text() == "mine" and (tmp_path / "mine" / "plan.yaml").is_file()


def test_a_journal_with_no_trial_refuses_no_rerun_and_resume_starts_over(runner, tmp_path):
    """A run killed before its first trial (no chance to clean up) leaves a journal header: it is no run to
    keep, so neither a plain rerun nor `--resume` with other settings is refused."""
    from tuner.workspace.journal import Journal, RunFingerprint

    path = model_file(tmp_path)
    for out in ("plain", "resumed"):
        (tmp_path / out).mkdir()
        Journal(tmp_path / out / "journal.jsonl", RunFingerprint(source="old", weights="old",
                                                                 settings={"data": "bad.jsonl"}), resume=False)
    assert mpt(runner, "tune", path, "--out", tmp_path / "plain", "-q").exit_code == exitcodes.OK
    res = mpt(runner, "tune", path, "--out", tmp_path / "resumed", "-q", "--resume")
    assert res.exit_code == exitcodes.OK, res.output
    header = json.loads((tmp_path / "resumed" / "journal.jsonl").read_text().splitlines()[0])
    assert header["source"] != "old"  # started over: the old header had nothing to resume


def test_data_tensors_the_forward_does_not_take_are_bad_input_not_an_error_in_the_model_file(runner, tmp_path):
    """A data file's names are checked against the built model's forward: exit 2 naming the file and the fix,
    not exit 4 quoting the forward's TypeError, and the folder the run claimed is left as it was (none)."""
    from safetensors.torch import save_file

    ids = torch.randint(0, 50, (6, 7))
    save_file({"input_ids": ids, "attention_masks": torch.ones_like(ids)}, tmp_path / "typo.safetensors")
    res = mpt(runner, "tune", ASSETS / "kwargs_model.py", "--metric", "cosine", "--data", tmp_path / "typo.safetensors",
              "--out", tmp_path / "o", "-q")
    assert_error(res, exitcodes.USAGE, "--data: ", "typo.safetensors holds 1 tensor attention_masks, which "
                 "TinyEncoder.forward does not take (it takes input_ids, attention_mask)", "name each tensor")
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


# --- the device ----------------------------------------------------------------------------------------------

def test_cuda_requested_without_a_gpu(runner, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert_error(tune(runner, tmp_path, model_file(tmp_path), "--device", "cuda"), exitcodes.USAGE,
                 "no CUDA device is available")
    assert not (tmp_path / "out").exists()  # refused before the search (and before --out is touched)


def test_bf16_on_a_gpu_without_bf16(runner, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "Tesla V100-SXM2-16GB")
    assert_error(tune(runner, tmp_path, model_file(tmp_path), "--device", "cuda", "--dtype", "bf16"),
                 exitcodes.USAGE, "Tesla V100-SXM2-16GB cannot run bfloat16; use --dtype fp16")
    assert not (tmp_path / "out").exists()


def test_fp16_matmul_unsupported_on_this_cpu(runner, tmp_path, monkeypatch):
    real = torch.Tensor.__matmul__

    def matmul(self, other):
        if self.dtype == torch.float16:
            raise RuntimeError("\"addmm_impl_cpu_\" not implemented for 'Half'")
        return real(self, other)

    monkeypatch.setattr(torch.Tensor, "__matmul__", matmul)
    assert_error(tune(runner, tmp_path, model_file(tmp_path), "--dtype", "fp16"), exitcodes.USAGE,
                 "this CPU build cannot run fp16 matmuls", "not implemented for 'Half'")
    assert not (tmp_path / "out").exists()


# --- usage ------------------------------------------------------------------------------------------------

def test_bad_option_values_are_usage_errors(runner, tmp_path):
    path = model_file(tmp_path)
    res = mpt(runner, "tune", path, "--dtype", "fp8")
    assert res.exit_code == exitcodes.USAGE and "fp8" in res.stderr
    assert_error(tune(runner, tmp_path, path, "--tolerance", "-1"), exitcodes.USAGE, "tolerance: expected a number >= 0")
    assert_error(tune(runner, tmp_path, path, "--tolerance", "5"), exitcodes.USAGE,
                 "a relative tolerance must be below 1")
    assert_error(tune(runner, tmp_path, path, "--preset", "hmpp"), exitcodes.USAGE,
                 "unknown preset 'hmpp'; did you mean")
    assert_error(mpt(runner, "tune"), exitcodes.USAGE, "missing MODEL.py")


def test_exit_codes_are_documented_in_help(runner):
    res = mpt(runner, "--help")
    assert res.exit_code == 0
    for code, word in ((0, "success"), (3, "target not met"), (2, "bad usage"), (4, "model file"),
                       (130, "interrupted"), (1, "internal error")):
        assert any(line.strip().startswith(str(code)) and word in line for line in res.stdout.splitlines()), \
            (code, word)


# --- module patterns ---------------------------------------------------------------------------------------

def test_a_module_pattern_that_matches_nothing_is_refused(runner, tmp_path):
    path = model_file(tmp_path)
    assert mpt(runner, "inspect", path, "--module", "2=fp32", "--module", "*=fp32").exit_code == exitcodes.OK
    res = mpt(runner, "inspect", path, "--module", "nosuch.*=fp32", "--module", "0=fp32")
    err = assert_error(res, exitcodes.USAGE, "module pattern 'nosuch.*' matches no module", "0, 1, 2")
    assert "'0'" not in err  # the pattern that does match is not blamed


def test_autocast_modules_that_match_nothing_are_refused():
    import tuner
    from tuner.core.errors import ConfigError

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    with pytest.raises(ConfigError, match="module pattern 'typo' matches no module of the model"):
        tuner.autocast("torch-cpu", "bf16", model=model, modules={"typo": "fp32"})
    with tuner.autocast("torch-cpu", "bf16", model=model, modules={"0": "fp32"}):
        assert model(torch.ones(2, 4)).dtype == torch.float32  # the override that matches still applies


# --- out of memory ---------------------------------------------------------------------------------------------

OOM_EVALUATE = """\
def evaluate(model):
    import os
    counter = os.environ["MPT_TEST_CALLS"]
    with open(counter, "a") as fh:
        fh.write("x")
    n = len(open(counter).read())
    if str(n) in os.environ.get("MPT_TEST_OOM", "").split(","):
        torch.empty(1 << 50, dtype=torch.uint8)  # a real allocation failure: 1 PiB
    with torch.no_grad():
        out = model(torch.ones(3, 4))
    return 1.0 - 0.0 * float(out.sum())
"""


def _journal(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()[1:]]


def test_a_transient_out_of_memory_in_a_trial_is_retried_not_journaled(runner, tmp_path, monkeypatch):
    path = model_file(tmp_path, {"evaluate": OOM_EVALUATE})
    monkeypatch.setenv("MPT_TEST_CALLS", str(tmp_path / "clean.calls"))
    clean = mpt(runner, "tune", path, "--out", tmp_path / "clean", "-q", "--no-latency")
    assert clean.exit_code == exitcodes.OK, clean.output
    first_trial = next(n for n, r in enumerate(_journal(tmp_path / "clean"), 1) if not r["key"].startswith("baseline"))
    monkeypatch.setenv("MPT_TEST_CALLS", str(tmp_path / "oom.calls"))
    monkeypatch.setenv("MPT_TEST_OOM", str(first_trial))  # that evaluation runs out of memory, once
    res = mpt(runner, "tune", path, "--out", tmp_path / "oom", "-q", "--no-latency")
    assert res.exit_code == exitcodes.OK, res.output
    records = _journal(tmp_path / "oom")
    assert not any(r.get("error") for r in records)  # never an accuracy failure
    assert [r["key"] for r in records] == [r["key"] for r in _journal(tmp_path / "clean")]
    plan = lambda out: yaml.safe_load((out / "plan.yaml").read_text())["fp32_instances"]  # noqa: E731
    assert plan(tmp_path / "oom") == plan(tmp_path / "clean")


def test_out_of_memory_is_one_message_and_exit_2_wherever_it_hits(runner, tmp_path, monkeypatch):
    path = model_file(tmp_path, {"evaluate": OOM_EVALUATE})
    monkeypatch.setenv("MPT_TEST_CALLS", str(tmp_path / "calls"))
    monkeypatch.setenv("MPT_TEST_OOM", ",".join(str(n) for n in range(2, 50)))  # from the 2nd evaluation on
    out = tmp_path / "out"
    res = mpt(runner, "tune", path, "--out", out, "-q", "--no-latency")
    line = line_of(path, "1 << 50")
    err = assert_error(res, exitcodes.USAGE, "out of memory while running evaluate", f"(model.py:{line})",
                       "can't allocate memory", "free memory")
    assert err.splitlines()[0].startswith("mpt: error: out of memory while ")
    assert not any(r.get("error") for r in _journal(out))  # the trial that ran out is not journaled
    monkeypatch.delenv("MPT_TEST_OOM")
    assert mpt(runner, "tune", path, "--out", out, "-q", "--no-latency", "--resume").exit_code == exitcodes.OK
    # the same message and code from build_model and from a forward pass in inspect
    huge = "def build_model():\n    return torch.empty(1 << 50, dtype=torch.uint8)\n"
    build = model_file(tmp_path, {"build_model": huge}, name="build.py")
    assert_error(mpt(runner, "inspect", build), exitcodes.USAGE, "out of memory while running build_model",
                 "(build.py:")
    fwd = model_file(tmp_path, {"example_inputs": "def example_inputs():\n    return (torch.ones(3, 4),)\n"},
                     name="fwd.py", extra=textwrap.dedent("""
        class Big(nn.Module):
            def forward(self, x):
                return x + torch.empty(1 << 50, dtype=torch.uint8).sum()


        def build_model():
            return Big()
        """))
    assert_error(mpt(runner, "inspect", fwd), exitcodes.USAGE, "out of memory while running ", "free memory")


@pytest.mark.parametrize(("args", "fragments"), [
    (["tune", "m.py", "--dtype", "fp8"], ["'--dtype'", "'fp8'", "bf16", "see mpt tune --help"]),
    (["tune", "m.py", "--max-evals", "abc"], ["'--max-evals'", "see mpt tune --help"]),
    (["--bogus"], ["'--bogus'", "see mpt --help"]),
    (["nosuch"], ["'nosuch'", "see mpt --help"])])
def test_click_usage_errors_are_one_mpt_error_line(runner, args, fragments):
    """A bad choice or an unknown option reads like every other error: one line, exit 2, no usage block."""
    res = mpt(runner, *args)
    err = assert_error(res, exitcodes.USAGE, *fragments)
    assert err.count("\n") == 1 and "Usage:" not in res.output and "Error:" not in res.output
    assert "Usage:" in mpt(runner).output  # `mpt` alone still shows the help


def test_a_missing_plan_path_is_not_an_unknown_preset(runner, tmp_path):
    res = mpt(runner, "inspect", ASSETS / "valid_model.py", "--plan", tmp_path / "runs" / "nope")
    err = assert_error(res, exitcodes.USAGE, f"--plan: {tmp_path / 'runs' / 'nope'} not found", "plan.yaml")
    assert "preset" not in err


def test_a_refused_out_is_said_before_any_building_line(runner, tmp_path):
    """A refusal that needs no model comes alone: no "building the model ..." line before it (piped output)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"mine")
    res = mpt(runner, "tune", ASSETS / "valid_model.py", "--out", out)
    assert_error(res, exitcodes.USAGE, "mpt did not write")
    assert "building the model" not in res.output


def test_an_interrupt_before_the_first_evaluation_finished_says_nothing_was_kept(runner, tmp_path):
    """Ctrl-C in the first FP32 evaluation: the folder is removed, so "finished work was kept (rerun with
    --resume)" would be wrong; the message says nothing was kept and no --resume is needed."""
    path = model_file(tmp_path, {"evaluate": "def evaluate(model):\n    raise KeyboardInterrupt\n"})
    res = tune(runner, tmp_path, path)
    err = assert_error(res, exitcodes.INTERRUPTED, "interrupted before the first evaluation finished",
                       "nothing was kept", "nothing to resume")
    assert "finished work was kept" not in err and "rerun with --resume" not in err
    assert not (tmp_path / "out").exists()

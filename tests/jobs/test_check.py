"""`mpt check DIR`: re-evaluate a committed plan; exit 0 while it meets its target, 3 once it does not."""
from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from mpt_cli import exitcodes
from mpt_cli.main import main
from tuner.jobs.check_run import CheckResult, check_plan, junit_xml

ASSETS = Path(__file__).parents[1] / "assets"
PLANTED = ASSETS / "planted_model.py"  # MPT_TEST_FRAGILE=1: branches.0 must stay FP32; =2: branches.1 too
# The same model; MPT_TEST_RETRAINED=1 changes its weights (not its structure) so that the tuned plan fails.
RETRAINED = ASSETS / "planted_retrained.py"


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> Path:
    """One `mpt tune` of the planted model (one fragile branch), shared by the tests (each copies it)."""
    # Same depth as `run`'s copy below, so the model path plan.yaml keeps relative to its folder still holds.
    out = tmp_path_factory.mktemp("tuned") / "repo" / "mpt" / "bf16"
    res = CliRunner().invoke(main, ["tune", str(RETRAINED), "--out", str(out), "-q"],
                             env={"MPT_TEST_FRAGILE": "1"})
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture
def run(tuned, tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("MPT_TEST_FRAGILE", "1")
    dest = tmp_path / "repo" / "mpt" / "bf16"
    shutil.copytree(tuned, dest)
    return dest


def check(runner, *args):
    res = runner.invoke(main, ["check", *[str(a) for a in args]])
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    return res


def recorded_model(folder: Path) -> dict:
    return yaml.safe_load((folder / "plan.yaml").read_text())["model"]


def test_plan_records_its_model_as_data(tuned):
    ref = recorded_model(tuned)
    assert ref["file"].endswith("planted_retrained.py")
    assert {"structure", "weights", "source"} <= set(ref)
    assert not any(line.startswith("# model:") for line in (tuned / "plan.yaml").read_text().splitlines())


def test_pass_exit_0_with_a_verdict_line(runner, run):
    res = check(runner, run)
    assert res.exit_code == exitcodes.OK, res.output
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("check: PASS 1.000 >= target 0.9900 (baseline 1.000, tolerance 1%)")


def test_model_change_breaks_the_plan_exit_3(runner, run, monkeypatch):
    monkeypatch.setenv("MPT_TEST_RETRAINED", "1")  # new weights: the head now needs FP32
    res = check(runner, run)
    assert res.exit_code == exitcodes.TARGET_NOT_MET, res.output
    assert res.stdout.startswith("check: FAIL ") and "< target 0.99" in res.stdout
    assert "no longer meets its target" in res.stdout and "re-run `mpt tune`" in res.stdout


def test_json(runner, run, monkeypatch):
    res = check(runner, run, "--json")
    data = json.loads(res.stdout)
    assert data["status"] == "pass" and data["exit_code"] == 0 and data["passed"] is True
    assert data["baseline"] == 1.0 and data["target"] == pytest.approx(0.99) and data["metric"] == 1.0
    assert data["dtype"] == "bf16" and data["weights"] == "fresh" and data["verdict"].startswith("check: PASS")
    monkeypatch.setenv("MPT_TEST_RETRAINED", "1")
    res = check(runner, run, "--json")
    assert res.exit_code == exitcodes.TARGET_NOT_MET
    data = json.loads(res.stdout)
    assert data["status"] == "fail" and data["exit_code"] == 3 and data["metric"] < data["target"]


def test_junit_pass_and_fail(runner, run, tmp_path, monkeypatch):
    report = tmp_path / "reports" / "mpt.xml"
    assert check(runner, run, "--junit", report).exit_code == 0
    root = ET.parse(report).getroot()
    suites = root.findall("testsuite")
    assert len(suites) == 1 and suites[0].get("tests") == "1" and suites[0].get("failures") == "0"
    cases = suites[0].findall("testcase")
    assert len(cases) == 1 and cases[0].find("failure") is None
    assert "check: PASS" in cases[0].find("system-out").text

    monkeypatch.setenv("MPT_TEST_RETRAINED", "1")
    assert check(runner, run, "--junit", report).exit_code == exitcodes.TARGET_NOT_MET
    suite = ET.parse(report).getroot().find("testsuite")
    assert suite.get("failures") == "1"
    failure = suite.find("testcase").find("failure")
    assert failure is not None and failure.get("message").startswith("check: FAIL")


def test_junit_reports_errors_too(runner, run, tmp_path):
    (run / "plan.yaml").write_text((run / "plan.yaml").read_text().replace("version: 1", "version: 9"))
    report = tmp_path / "mpt.xml"
    res = check(runner, run, "--junit", report)
    assert res.exit_code == exitcodes.USAGE
    error = ET.parse(report).getroot().find("testsuite").find("testcase").find("error")
    assert error is not None and "newer than this mpt reads" in error.get("message")


def test_model_path_is_relative_to_the_folder(runner, tmp_path, monkeypatch):
    monkeypatch.setenv("MPT_TEST_FRAGILE", "1")
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    shutil.copy(PLANTED, repo / "src" / "model.py")
    monkeypatch.chdir(repo)
    res = runner.invoke(main, ["tune", "src/model.py", "--out", "mpt/bf16", "-q"])
    assert res.exit_code == 0, res.output
    assert recorded_model(repo / "mpt" / "bf16")["file"] == "../../src/model.py"
    monkeypatch.chdir(tmp_path)  # any working directory
    assert check(runner, repo / "mpt" / "bf16").exit_code == 0
    # The folder copied away from the model: the recorded relative path no longer resolves.
    moved = tmp_path / "elsewhere" / "x"
    shutil.copytree(repo / "mpt" / "bf16", moved)
    res = check(runner, moved)
    assert res.exit_code == exitcodes.USAGE
    assert "--model: the plan in" in res.stderr and "was made for ../../src/model.py" in res.stderr
    assert "which is not there" in res.stderr
    assert check(runner, moved, "--model", repo / "src" / "model.py").exit_code == 0


def test_plan_without_a_model_needs_the_model_file(runner, run):
    data = yaml.safe_load((run / "plan.yaml").read_text())
    del data["model"]
    (run / "plan.yaml").write_text(yaml.safe_dump(data))
    res = check(runner, run)
    assert res.exit_code == exitcodes.USAGE and "does not record which model" in res.stderr
    assert res.stderr.startswith("mpt: error: --model: ")
    assert check(runner, run, "--model", RETRAINED).exit_code == 0


def test_plan_for_another_model_is_refused(runner, run, tmp_path, monkeypatch):
    other = tmp_path / "other.py"
    other.write_text(RETRAINED.read_text().replace("_Task(16,", "_Task(12,"))
    res = check(runner, run, "--model", other)
    assert res.exit_code == exitcodes.USAGE, res.output
    assert "was made for another model" in res.stderr and "module tree or parameter shapes differ" in res.stderr
    monkeypatch.setenv("MPT_TEST_FRAGILE", "2")  # the recorded model file, now with another architecture
    res = check(runner, run)
    assert res.exit_code == exitcodes.USAGE and "was made for another model" in res.stderr


def test_missing_folder_and_missing_plan(runner, tmp_path):
    res = check(runner, tmp_path / "nope")
    assert res.exit_code == exitcodes.USAGE and "plan folder not found" in res.stderr
    res = check(runner, tmp_path)
    assert res.exit_code == exitcodes.USAGE and "no plan.yaml in" in res.stderr
    res = check(runner)
    assert res.exit_code == exitcodes.USAGE and "missing DIR" in res.stderr


def test_plan_naming_modules_the_model_lacks(runner, run):
    text = (run / "plan.yaml").read_text().replace("module: branches.0", "module: branches.7")
    (run / "plan.yaml").write_text(text)
    res = check(runner, run)
    assert res.exit_code == exitcodes.USAGE
    assert "does not match this model" in res.stderr and "branches.7" in res.stderr


def test_plan_from_a_newer_version(runner, run):
    (run / "plan.yaml").write_text((run / "plan.yaml").read_text().replace("version: 1", "version: 2"))
    res = check(runner, run)
    assert res.exit_code == exitcodes.USAGE and "plan version 2 is newer than this mpt reads (1)" in res.stderr


def test_checkpoint_mode(runner, run):
    res = check(runner, run, "--checkpoint", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["weights"] == "checkpoint"


def record_checkpoint_digest(run: Path) -> None:
    """Make plan.yaml vouch for the (edited) checkpoint, so the checks behind the digest are reached."""
    from tuner.core.fingerprint import sha256_file

    data = yaml.safe_load((run / "plan.yaml").read_text())
    data["checkpoint_sha256"] = sha256_file(run / "model.safetensors")
    (run / "plan.yaml").write_text(yaml.safe_dump(data))


def test_truncated_or_corrupted_checkpoint(runner, run):
    ckpt = run / "model.safetensors"
    data = ckpt.read_bytes()
    ckpt.write_bytes(data[: len(data) // 2])
    res = check(runner, run, "--checkpoint")
    assert res.exit_code == exitcodes.USAGE and "does not match plan.yaml: its sha256 differs" in res.stderr
    record_checkpoint_digest(run)
    res = check(runner, run, "--checkpoint")
    assert res.exit_code == exitcodes.USAGE and "truncated or corrupted" in res.stderr
    ckpt.write_bytes(b"\xff" * 64)
    record_checkpoint_digest(run)
    res = check(runner, run, "--checkpoint")
    assert res.exit_code == exitcodes.USAGE and "truncated or corrupted" in res.stderr


def test_checkpoint_that_does_not_match_the_model(runner, run):
    from safetensors.torch import load_file, save_file

    ckpt = run / "model.safetensors"
    tensors = load_file(str(ckpt))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name][..., :1].contiguous()  # shape mismatch
    tensors["extra.weight"] = tensors[sorted(tensors)[1]].clone()  # extra key
    del tensors[sorted(k for k in tensors if k != name and k != "extra.weight")[-1]]  # missing key
    save_file(tensors, str(ckpt))
    record_checkpoint_digest(run)
    res = check(runner, run, "--checkpoint")
    assert res.exit_code == exitcodes.USAGE
    for fragment in ("does not match this model", "missing from the checkpoint", "not in the model: extra.weight",
                     f"{name}: shape"):
        assert fragment in res.stderr, res.stderr


def test_user_code_failing_in_check(runner, run, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(RETRAINED.read_text() + "\n\ndef evaluate(model):\n    raise ValueError('dataset moved')\n")
    res = check(runner, run, "--model", bad)
    assert res.exit_code == exitcodes.USER_CODE and "evaluate raised ValueError: dataset moved (bad.py:" in res.stderr


def test_tolerance_override(runner, run, monkeypatch):
    monkeypatch.setenv("MPT_TEST_RETRAINED", "1")
    res = check(runner, run, "--tolerance", "0.9", "--json")
    data = json.loads(res.stdout)
    assert data["tolerance"] == 0.9 and data["status"] == "pass"


def test_library_function_without_click(run):
    result = check_plan(str(run))
    assert isinstance(result, CheckResult) and result.passed and result.metric == 1.0
    assert result.plan.endswith("plan.yaml") and result.spread == 0.0 and result.margin == 0.0
    assert result.verdict().startswith("check: PASS") and "noise" not in result.verdict()
    with pytest.raises(Exception):
        result.passed = False  # frozen


def test_junit_xml_is_built_by_the_library():
    root = ET.fromstring(junit_xml("case", seconds=1.5, failure="check: FAIL", details="why").split("\n", 1)[1])
    case = root.find("testsuite").find("testcase")
    assert case.get("name") == "case" and case.find("failure").text == "why"


def test_junit_that_cannot_be_written_exits_2(runner, run, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    res = check(runner, run, "--junit", blocker / "mpt.xml")
    assert res.exit_code == exitcodes.USAGE and "cannot write the JUnit report" in res.stderr
    res = check(runner, run, "--junit", tmp_path)
    assert res.exit_code == exitcodes.USAGE and res.stderr.startswith(f"mpt: error: --junit: {tmp_path} is a folder")


def test_function_names_given_to_tune_are_recorded_for_check(runner, tmp_path, monkeypatch):
    source = RETRAINED.read_text().replace("def build_model(", "def make(").replace("evaluate = ", "score = ")
    (tmp_path / "model.py").write_text(source)
    monkeypatch.setenv("MPT_TEST_FRAGILE", "1")
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(main, ["tune", "model.py:make", "--eval", "score", "--out", "run", "-q"])
    assert res.exit_code == 0, res.output
    ref = recorded_model(tmp_path / "run")
    assert (ref["file"], ref["build"], ref["eval"]) == ("../model.py", "make", "score") and "inputs" not in ref
    assert check(runner, "run").exit_code == 0
    monkeypatch.setenv("MPT_TEST_RETRAINED", "1")
    assert check(runner, "run").exit_code == exitcodes.TARGET_NOT_MET


def test_a_given_function_replaces_a_recorded_one_that_is_gone(runner, run):
    data = yaml.safe_load((run / "plan.yaml").read_text())
    data["model"]["eval"] = "../gone.py:score"
    (run / "plan.yaml").write_text(yaml.safe_dump(data))
    res = check(runner, run)
    assert res.exit_code == exitcodes.USAGE and res.stderr.startswith("mpt: error: --eval: the plan in")
    assert "../gone.py (the eval function's file), which is not there" in res.stderr
    assert check(runner, run, "--eval", "evaluate").exit_code == 0

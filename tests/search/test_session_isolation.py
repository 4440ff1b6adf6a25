"""Results a user can trust: isolated trials, a fingerprinted journal, one run per folder, bounds that keep
the best plan, outputs committed as a set, and noisy metrics.

CLI cases go through click's CliRunner on tests/assets/planted_file.py (2 fragile linears among 24; it has
no example_inputs(), so the inputs are recorded from evaluate's first forward unless --inputs is given).
"""
from __future__ import annotations

import errno
import json
import shutil
import time
import uuid
from pathlib import Path

import pytest
import torch
import yaml

import tuner
from mpt_cli import exitcodes
from mpt_cli.main import main
from tuner.core.errors import UserCodeError
from tuner.core.loader import load_user_model
from tuner.testing import PlantedTask
from tuner.options.tune import TuneOptions
from tuner.search.results import StopReason, TuneStatus
from tuner.search.repeatable import repeatable
from tuner.search.session import tune

ASSET = Path(__file__).parents[1] / "assets" / "planted_file.py"


@pytest.fixture
def model_py(tmp_path) -> Path:
    path = tmp_path / "planted.py"
    shutil.copy(ASSET, path)
    return path


def mpt(runner, *args):
    res = runner.invoke(main, [str(a) for a in args])
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise AssertionError(f"mpt raised instead of exiting: {res.exception!r}\n{res.output}")
    return res


def fp32_labels(out: Path) -> set[str]:
    plan = yaml.safe_load((out / "plan.yaml").read_text())
    return {f"{i['module']}:{i['op']}#{i['index']}" for i in plan["fp32_instances"]}


def journal_keys(out: Path) -> list[str]:
    lines = (out / "journal.jsonl").read_text().splitlines()
    return [json.loads(line)["key"] for line in lines[1:]]


def calls(counter: Path) -> int:
    return len(counter.read_text().splitlines()) if counter.is_file() else 0


# --- 2. every trial sees the FP32 model the user built --------------------------------------------------------

def test_an_evaluate_that_trains_the_model_finds_the_same_plan_as_a_clean_one():
    task = PlantedTask(24, 2)
    clean = tune(task.build, task.evaluate, task.example_inputs, TuneOptions())

    def training_evaluate(model):
        metric = task.evaluate(model)
        with torch.no_grad():
            for p in model.parameters():
                p.data.add_(0.05 * torch.randn_like(p))  # through .data: no version counter bump
        return metric

    dirty = tune(task.build, training_evaluate, task.example_inputs, TuneOptions())
    assert dirty.status is clean.status is TuneStatus.MET
    assert dirty.plan.fp32_instances == clean.plan.fp32_instances
    assert {i.label() for i in dirty.plan.fp32_instances} == task.build().fragile_labels()
    assert dirty.rebuilds == dirty.evals and clean.rebuilds == 0


def test_an_evaluate_that_swaps_a_module_is_undone_before_the_next_trial():
    task = PlantedTask(24, 2)
    clean = tune(task.build, task.evaluate, task.example_inputs, TuneOptions())

    def folding_evaluate(model):
        metric = task.evaluate(model)
        model.chain[0] = torch.nn.Identity()  # "fold" a layer away
        return metric

    folded = tune(task.build, folding_evaluate, task.example_inputs, TuneOptions())
    assert folded.plan.fp32_instances == clean.plan.fp32_instances and folded.rebuilds > 0


def test_a_build_with_unseeded_weights_is_reported_when_evaluate_changes_the_model():
    def build():
        return torch.nn.Sequential(torch.nn.Linear(4, 4))  # fresh random weights each call

    def evaluate(model):
        model[0] = torch.nn.Identity()
        return 1.0

    with pytest.raises(UserCodeError, match="same weights on every call"):
        tune(build, evaluate, (torch.ones(2, 4),), TuneOptions())


def test_cli_mutating_evaluate_gives_the_clean_plan(runner, tmp_path, model_py, monkeypatch):
    clean = mpt(runner, "tune", model_py, "--out", tmp_path / "clean", "-q")
    monkeypatch.setenv("MPT_TEST_MUTATE", "1")
    dirty = mpt(runner, "tune", model_py, "--out", tmp_path / "dirty", "-q")
    assert clean.exit_code == dirty.exit_code == exitcodes.OK, clean.output + dirty.output
    assert fp32_labels(tmp_path / "dirty") == fp32_labels(tmp_path / "clean") and fp32_labels(tmp_path / "clean")
    assert json.loads((tmp_path / "dirty" / "report.json").read_text())["rebuilds"] > 0


# --- 3. a journal that knows what it measured ---------------------------------------------------------------

def test_resume_after_editing_the_model_file_is_refused(runner, tmp_path, model_py):
    out = tmp_path / "out"
    first = mpt(runner, "tune", model_py, "--out", out, "--max-evals", "2", "-q")
    assert first.exit_code == exitcodes.TARGET_NOT_MET, first.output
    model_py.write_text(model_py.read_text() + "\n# an edit\n")
    res = mpt(runner, "tune", model_py, "--out", out, "--resume", "-q")
    assert res.exit_code == exitcodes.USAGE, res.output
    assert res.stderr.startswith("mpt: error: ") and "the model file's content changed" in res.stderr


def test_resume_after_editing_a_file_the_model_file_imports_is_refused(runner, tmp_path, model_py):
    """A sibling module's edit changes what evaluate measures: the journal's fingerprint covers it."""
    sibling = f"metric_{uuid.uuid4().hex[:8]}"  # a name of its own: Python caches imported modules by name
    (tmp_path / f"{sibling}.py").write_text("SCALE = 1.0\n\n\ndef score(value):\n    return value * SCALE\n")
    source = model_py.read_text().replace("import torch\n", f"import torch\nfrom {sibling} import score\n", 1)
    model_py.write_text(source.replace("    return metric\n", "    return score(metric)\n"))
    out = tmp_path / "out"
    first = mpt(runner, "tune", model_py, "--out", out, "--max-evals", "2", "-q")
    assert first.exit_code == exitcodes.TARGET_NOT_MET, first.output
    header = json.loads((out / "journal.jsonl").read_text().splitlines()[0])
    assert list(header["files"]) == ["planted.py", f"{sibling}.py"]
    same = mpt(runner, "tune", model_py, "--out", out, "--resume", "--max-evals", "2", "-q")
    assert same.exit_code == exitcodes.TARGET_NOT_MET, same.output  # nothing changed: it resumes
    (tmp_path / f"{sibling}.py").write_text((tmp_path / f"{sibling}.py").read_text().replace("1.0", "0.5"))
    res = mpt(runner, "tune", model_py, "--out", out, "--resume", "-q")
    assert res.exit_code == exitcodes.USAGE, res.output
    assert res.stderr.startswith("mpt: error: ") and f"cannot resume: {sibling}.py (imported by the model file) " \
        "changed since the journal was written" in res.stderr, res.stderr
    assert "the model file's content changed" not in res.stderr


def test_resume_with_other_settings_names_the_setting(runner, tmp_path, model_py):
    out = tmp_path / "out"
    mpt(runner, "tune", model_py, "--out", out, "--max-evals", "3", "-q")
    res = mpt(runner, "tune", model_py, "--out", out, "--resume", "--tolerance", "0.05", "-q")
    assert res.exit_code == exitcodes.USAGE, res.output
    assert "cannot resume: --tolerance was 0.01 when the journal was written and is 0.05 now (use --overwrite to " \
        "start over)" in res.stderr
    res = mpt(runner, "tune", model_py, "--out", out, "--resume", "--thorough", "-q")  # how the search goes, too
    assert res.exit_code == exitcodes.USAGE and "--thorough was not set when the journal was written and is True now" \
        in res.stderr


def test_resume_without_example_inputs_repeats_no_evaluation(runner, tmp_path, model_py, monkeypatch):
    out, counter = tmp_path / "out", tmp_path / "calls.txt"
    monkeypatch.setenv("MPT_TEST_COUNT", str(counter))
    first = mpt(runner, "tune", model_py, "--out", out, "--max-evals", "2", "-q")
    assert first.exit_code == exitcodes.TARGET_NOT_MET and calls(counter) == 2 == len(journal_keys(out))
    assert (out / "journal-inputs.safetensors").is_file()  # the recorded inputs are kept for --resume
    res = mpt(runner, "tune", model_py, "--out", out, "--resume", "-q")
    assert res.exit_code == exitcodes.OK, res.output
    keys = journal_keys(out)
    assert calls(counter) == len(keys) and len(keys) == len(set(keys))  # each call made one new entry


def test_a_journal_torn_inside_its_header_starts_over(runner, tmp_path, model_py):
    from tuner.workspace.manifest import Manifest

    out = tmp_path / "out"
    out.mkdir()
    Manifest(out).writing("journal.jsonl")  # what a run records before it writes the journal's header
    (out / "journal.jsonl").write_text('{"kind": "header", "format": 2, "sou')  # killed mid-header
    res = mpt(runner, "tune", model_py, "--out", out, "--resume", "-q")
    assert res.exit_code == exitcodes.OK, res.output
    header = json.loads((out / "journal.jsonl").read_text().splitlines()[0])
    assert header["kind"] == "header" and header["weights"] and header["source"]


# --- 4. one run per output folder ---------------------------------------------------------------------------

@pytest.mark.parametrize("flag", [None, "--resume", "--overwrite"])
def test_a_second_run_on_a_busy_folder_is_refused(runner, tmp_path, model_py, flag):
    from tuner.workspace.folder import OutputFolder
    from tuner.core.output_files import OUTPUT_FILES

    out = tmp_path / "out"
    assert mpt(runner, "tune", model_py, "--out", out, "-q").exit_code == exitcodes.OK
    with OutputFolder.claim(out, resume=True, overwrite=False, outputs=OUTPUT_FILES):  # "another run"
        before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
        res = mpt(runner, "tune", model_py, "--out", out, "-q", *([flag] if flag else []))
        after = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert res.exit_code == exitcodes.USAGE, res.output
    assert "is in use by another mpt run (pid" in res.stderr.splitlines()[0]
    assert after == before  # nothing touched, the lock's owner line included


def test_a_stale_lock_from_a_killed_run_does_not_block(runner, tmp_path, model_py):
    out = tmp_path / "out"
    out.mkdir()
    (out / ".mpt.lock").write_text("pid 999999, started 2026-01-01 00:00:00\n")  # no process holds it
    assert mpt(runner, "tune", model_py, "--out", out, "-q").exit_code == exitcodes.OK


# --- 5. bounds and interruptions keep the best --------------------------------------------------------------

def test_time_budget_counts_from_the_start_of_the_command():
    task = PlantedTask(24, 2)
    result = tune(task.build, task.evaluate, task.example_inputs, TuneOptions(time_budget=30),
                  started=time.monotonic() - 60)  # the command started a minute ago
    assert result.stopped is StopReason.TIME_BUDGET and result.evals == 1  # the baseline only


def test_ctrl_c_after_passing_trials_leaves_a_loadable_plan(runner, tmp_path, model_py, monkeypatch):
    out = tmp_path / "out"
    full = mpt(runner, "tune", model_py, "--out", tmp_path / "full", "--thorough", "-q")
    report = json.loads((tmp_path / "full" / "report.json").read_text())
    first_pass = next(t["n"] for t in report["trials"] if t["passed"] and not t["baseline"])
    monkeypatch.setenv("MPT_TEST_INTERRUPT_AT", str(first_pass + 1))  # the evaluation after the first pass
    res = mpt(runner, "tune", model_py, "--out", out, "--thorough", "-q")
    assert full.exit_code == exitcodes.OK and res.exit_code == exitcodes.INTERRUPTED, res.output
    assert "wrote the best plan confirmed so far" in res.stderr
    plan = yaml.safe_load((out / "plan.yaml").read_text())
    assert plan["metrics"]["status"] == "ok" and plan["metrics"]["stopped"] == "interrupted"
    user = load_user_model(str(model_py), inputs="planted_inputs")
    loaded = tuner.load(user.build(), out)
    inputs = user.example_inputs()
    assert inputs.call(loaded).shape[0] == inputs.args[0].shape[0]


# --- 6. outputs committed as a set --------------------------------------------------------------------------

def test_disk_full_while_writing_leaves_no_plan_and_exits_2(runner, tmp_path, model_py, monkeypatch):
    import tuner.report.checkpoint

    out = tmp_path / "out"
    assert mpt(runner, "tune", model_py, "--out", out, "-q").exit_code == exitcodes.OK  # an earlier good run

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tuner.report.checkpoint, "write_safetensors", full_disk)
    res = mpt(runner, "tune", model_py, "--out", out, "--overwrite", "-q")
    assert res.exit_code == exitcodes.USAGE, res.output
    first = res.stderr.splitlines()[0]
    assert first.startswith("mpt: error: cannot write ") and "model.safetensors" in first
    assert "No space left on device" in first
    assert not (out / "plan.yaml").exists()  # nothing claims success
    assert not [p for p in out.iterdir() if p.name.startswith(".mpt-staging") or p.name.endswith(".tmp")]


def test_plan_and_report_agree(runner, tmp_path, model_py):
    out = tmp_path / "out"
    assert mpt(runner, "tune", model_py, "--out", out, "-q").exit_code == exitcodes.OK
    plan = yaml.safe_load((out / "plan.yaml").read_text())
    report = json.loads((out / "report.json").read_text())
    assert report["plan"] == plan and report["status"] == plan["metrics"]["status"]
    assert report["fp32_instances"] == sorted(fp32_labels(out))
    assert plan["checkpoint_sha256"] == tuner.core.fingerprint.sha256_file(out / "model.safetensors")


# --- 7. noisy metrics ---------------------------------------------------------------------------------------

def test_deterministic_evaluate_costs_one_baseline_run():
    task = PlantedTask(16, 0)
    result = tune(task.build, task.evaluate, task.example_inputs, TuneOptions())
    assert result.noise == 0 and [t.baseline for t in result.trials] == [True, False]
    assert repeatable(result.trials[0].signature, result.trials[1].signature)


def test_noisy_evaluate_is_measured_and_its_plan_holds_in_repeated_checks(runner, tmp_path, model_py, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setenv("MPT_TEST_NOISE", "0.004")  # the metric is 1.0 +- 0.4% (tolerance 1%)
    res = mpt(runner, "tune", model_py, "--out", out)
    assert res.exit_code == exitcodes.OK, res.output
    report = json.loads((out / "report.json").read_text())
    assert 0 < report["noise"] <= 0.008 and sum(t["baseline"] for t in report["trials"]) == 5
    assert "evaluate is not deterministic" in res.output
    assert all(t["metric"] > report["target"] + report["noise"] for t in report["trials"]
               if t["passed"] and not t["baseline"])
    for _ in range(5):
        check = mpt(runner, "check", out)
        assert check.exit_code == exitcodes.OK, check.output


@pytest.mark.parametrize("line", ['[1, 2]', '{"kind": "eval", "key": "fp32=", "metric": "high", "seconds": 1}',
                                  '{"kind": "eval", "key": "fp32="}', '\udcff'])
def test_a_damaged_journal_line_is_a_usage_error(runner, tmp_path, model_py, line):
    out = tmp_path / "out"
    mpt(runner, "tune", model_py, "--out", out, "--max-evals", "3", "-q")
    lines = (out / "journal.jsonl").read_text().splitlines()
    data = "\n".join([lines[0], line, *lines[1:]]) + "\n"
    (out / "journal.jsonl").write_bytes(data.encode("utf-8", "surrogateescape"))
    res = mpt(runner, "tune", model_py, "--out", out, "--resume", "-q")
    assert res.exit_code == exitcodes.USAGE, res.output
    assert "line 2 is damaged" in res.stderr and "--overwrite" in res.stderr


def test_sys_exit_in_evaluate_is_the_users_error(runner, tmp_path, model_py):
    model_py.write_text(model_py.read_text().replace("    _CALLS[0] += 1\n", "    _CALLS[0] += 1\n"
                                                       "    raise SystemExit(0)\n"))
    res = mpt(runner, "tune", model_py, "--out", tmp_path / "out", "-q")
    assert res.exit_code == exitcodes.USER_CODE, res.output
    assert res.stderr.startswith("mpt: error: evaluate called sys.exit(0)") and "planted.py:" in res.stderr
    assert not (tmp_path / "out" / "plan.yaml").exists()

"""The report is measured once, typed: measure_report gives a TuneReport, the writer only serializes it, and the
verdict comes as fields the CLI composes (its sentence is the one search.html states)."""
from __future__ import annotations

import dataclasses
import json
import re

import pytest

from tuner.core.output_files import COMMITTED, HMP_FP16_NAME, MANIFEST_NAME, PLAN_NAME, SHARDED_CHECKPOINT_NAME
from tuner.engine.native import ExecutionPath
from tuner.policy.plan import Plan
import tuner.report.measuring as measuring
from tuner.report.json_report import report_dict
from tuner.report.latency import judge
from tuner.report.measuring import measure_report
from tuner.report.outcome import TuneReport
from tuner.report.verdict import Verdict, verdict
from tuner.report.writer import write_outputs
from tuner.search.session import tune
from tuner.search.results import TuneOptions, TuneStatus
from tuner.testing import PlantedTask


@pytest.fixture(scope="module")
def tuned():
    task = PlantedTask(8, 1, samples=128)
    result = tune(task.build, task.evaluate, task.example_inputs, TuneOptions(dtype="bf16"))
    assert result.status is TuneStatus.MET and result.chosen is not None
    return task, result


def test_measure_report_is_typed_and_matches_the_chosen_trial(tuned):
    task, result = tuned
    model = task.build()
    report = measure_report(result, model, latency=False)
    assert isinstance(report, TuneReport) and report.latency is None and report.checkpoint is None
    chosen = next(t for t in report.trials if t.n == result.chosen)
    assert chosen.shares == report.shares and 0 < report.shares.flop_share <= 1
    assert [t.n for t in report.trials] == [t.n for t in result.trials]
    assert all(t == u for t, u in zip(report.trials, result.trials, strict=True) if t.n != result.chosen)
    assert report.plan == result.plan and report.plan.model is None  # no model ref given
    assert isinstance(report.execution.path, ExecutionPath)
    assert report.warnings == tuple(result.warnings)
    assert all(p.dtype.is_floating_point for p in model.parameters())  # the model is left in FP32


def test_the_tune_hands_the_reported_plans_observed_weight_dtypes_to_the_report(tuned):
    from tuner.core.inputs import ModelInputs
    from tuner.measure.deployed import weight_dtypes

    task, result = tuned
    model = task.build()
    assert result.lowered  # observed once, at the end of the tune, on the plan that gets reported
    assert result.lowered == weight_dtypes(model, result.plan, ModelInputs.of(result.inputs))
    assert measure_report(result, model, latency=False).lowered == result.lowered


def test_the_report_runs_no_recorded_forward_the_tune_already_ran(tuned, monkeypatch):
    """The report takes the tune's record of the plan (`TuneResult.recorded`) and records only what the tune did
    not: the list files' plan, where an op type is mixed (issue 44: a forward of a 774M model each)."""
    import tuner.report.checkpoint as checkpoint
    import tuner.report.oplists as oplists

    task, result = tuned
    assert result.recorded is not None
    forwards = []
    for module in (oplists, checkpoint):
        real = module.record_plan
        monkeypatch.setattr(module, "record_plan", lambda *a, real=real: forwards.append(a[1]) or real(*a))
    report = measure_report(result, task.build(), latency=False)
    assert report.lists is not None and report.lists.plan_shares == result.recorded.shares
    assert forwards == ([] if report.lists.exact else [report.lists.plan])  # never the plan itself again
    assert result.plan not in forwards


def test_measure_report_times_when_asked(tuned):
    task, result = tuned
    report = measure_report(result, task.build(), latency=True)
    assert report.latency is not None and report.latency.rounds >= 3
    assert report_dict(result, report)["latency_ms"]["order"] == "interleaved"


def test_the_writer_serializes_the_measured_report(tuned, tmp_path):
    task, result = tuned
    model = task.build()
    measured = measure_report(result, model, latency=False)
    written = write_outputs(result, measured, tmp_path, model=model)
    # model.dcp/: a sharded model's only; hmp_ops_fp16.txt: an fp16 plan's (this one is bf16)
    written_names = [n for n in COMMITTED if n not in (SHARDED_CHECKPOINT_NAME, HMP_FP16_NAME)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted((*written_names, MANIFEST_NAME))  # no staging left
    assert written.checkpoint is not None and written.plan.checkpoint_sha256
    assert written.shares == measured.shares and written.trials == measured.trials
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["plan"] == Plan.load(tmp_path / PLAN_NAME).to_dict() == written.plan.to_dict()
    assert data["checkpoint"] == written.checkpoint.to_dict()
    assert data == json.loads(json.dumps(report_dict(result, written), default=str))


def test_verdict_is_fields_and_its_sentence(tuned):
    task, result = tuned
    report = measure_report(result, task.build(), latency=False)
    said = verdict(result, report)
    assert said.met and said.head.startswith("target met: baseline ") and f"trial {result.chosen}" in said.head
    assert said.details[-1] == f"{result.evals} evaluations"
    assert str(said) == "; ".join((said.head, *said.details))
    missed = dataclasses.replace(result, status=TuneStatus.NOT_MET, chosen=None)
    not_met = verdict(missed, report)
    assert not not_met.met and not_met.details[0] == "the plan is all FP32"
    assert str(not_met).startswith("target not met: no plan reached ") and "; the plan is all FP32; " in str(not_met)
    with pytest.raises(ValueError):
        Verdict(met=True, head="", details=())


def test_a_re_tune_with_the_same_result_rewrites_plan_yaml_byte_for_byte(tuned, tmp_path):
    """plan.yaml carries no time (a re-tune's diff shows only what changed); report.json says when."""
    task, result = tuned
    texts, created = [], []
    for out in (tmp_path / "a", tmp_path / "b"):
        out.mkdir()
        model = task.build()
        write_outputs(result, measure_report(result, model, latency=False), out, model=model)
        texts.append((out / PLAN_NAME).read_bytes())
        created.append(json.loads((out / "report.json").read_text())["created"])
    assert texts[0] == texts[1] and texts[0].startswith(b"# mpt precision plan\n")
    assert not re.search(rb"\d{4}-\d{2}-\d{2}|\d\d:\d\d", texts[0])
    assert all(re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z", c) for c in created)


@pytest.mark.parametrize(("tuned_ms", "warned"), [(1.5, True), (1.01, False), (None, False)])
def test_the_slower_warning_follows_the_latency_verdict(tuned, monkeypatch, tuned_ms, warned):
    """Timed samples are synthetic here (the rule is what is tested): a measured slowdown warns; one within
    noise of FP32, or a timing too noisy to judge (tuned side stalling), does not."""
    task, result = tuned
    fp32_s = [1e-3 * (1 + 0.01 * (i % 3)) for i in range(30)]
    tuned_s = ([tuned_ms * 1e-3 * (1 + 0.01 * (i % 3)) for i in range(30)] if tuned_ms
               else [(5e-3 if i % 2 else 1e-3) * (1 + 0.1 * i) for i in range(30)])
    monkeypatch.setattr(measuring, "compare_latency", lambda *a, **k: judge(fp32_s, tuned_s))
    report = measure_report(result, task.build(), latency=True)
    assert report.latency is not None
    assert report.latency.verdict == {1.5: "slower", 1.01: "no measurable difference", None: "too noisy to judge"}[
        tuned_ms]
    assert any("ran slower than FP32" in w for w in report.warnings) is warned


def test_a_forward_the_baseline_shows_too_slow_to_time_is_not_run(tuned, monkeypatch):
    """The FP32 baseline's evaluate fed the model so many times the example inputs in so many seconds: where
    that pace (an upper bound) shows the timing cannot fit its budget twice over, no forward is spent on it.
    Where the pace leaves doubt, the timing runs as before."""
    task, result = tuned
    base = next(t for t in result.trials if t.baseline)
    assert base.fed, "the baseline counts what evaluate fed the model"
    timed = []
    monkeypatch.setattr(measuring, "compare_latency", lambda *a, **k: timed.append(1) or judge([1e-3] * 9, [1e-3] * 9))
    example = sum(t.numel() for t in task.example_inputs())
    slow = dataclasses.replace(base, seconds=100.0 * base.fed / example)  # 100 s a forward's worth of inputs
    trials = tuple(slow if t is base else t for t in result.trials)
    report = measure_report(dataclasses.replace(result, trials=trials), task.build(), latency=True)
    assert report.latency is None and not timed
    warning = next(w for w in report.warnings if "not timed" in w)
    assert "about 100.00 s a forward" in warning and "--no-latency" in warning
    report = measure_report(result, task.build(), latency=True)  # the real pace: a fast forward, timed
    assert report.latency is not None and timed == [1]

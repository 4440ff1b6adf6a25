"""One set of numbers: trial lines, the summary, report.json, report.md and search.html agree.

The lower-precision share is defined once (tuner.measure.shares): FLOP share first, call share second. Trials are
numbered from 1 in the order they ran, the FP32 baseline's run being trial 1, alike everywhere. A run's
metrics are written with the digits that tell them from its target and baseline (tuner.report.metric_text).
"""
import json
import re
import shutil
from pathlib import Path

import pytest

from mpt_cli.main import main
from tuner.core.output_files import COMMITTED, OUTPUT_FILES
from tuner.report.metric_text import fmt_metric, metric_digits

ASSETS = Path(__file__).parents[1] / "assets"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def tune(runner, model: Path, out: Path, *extra: str):
    res = runner.invoke(main, ["tune", str(model), "--out", str(out), "--no-latency", *extra])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    return res


def trial_lines(stdout: str) -> dict[int, str]:
    return {int(line.split()[1]): line for line in stdout.splitlines() if line.startswith("eval ")}


def run_digits(report: dict) -> int:
    return metric_digits(report["baseline_metric"], report["target"],
                         [report["final_metric"], *(t["metric"] for t in report["trials"])])


def line_metric(line: str) -> str:
    return line.split("metric", 1)[1].split()[0]


def check_agreement(res, out: Path) -> dict:
    report = json.loads((out / "report.json").read_text())
    d = run_digits(report)
    lines = trial_lines(res.stdout)
    trials = report["trials"]
    # numbered 1.. in the terminal and report.json alike; the baseline's one run is trial 1 (deterministic)
    assert sorted(lines) == [t["n"] for t in trials] == list(range(1, report["evaluations"] + 1))
    assert [t["n"] for t in trials if t["baseline"]] == [1]
    page = (out / "search.html").read_text()
    rows = re.findall(r"<tr[^>]*><td>(\d+)</td><td>.*?</td><td[^>]*>(.*?)</td><td>\w+</td><td>(.*?)</td>", page)
    assert [int(n) for n, _, _ in rows] == [t["n"] for t in trials]
    for (n, metric, share), t in zip(rows, trials):
        line = lines[t["n"]]
        flop = f"{round(t['low_precision_flop_share'] * 100)}% FLOPs"
        assert flop in line and share.strip() == flop, (line, share, t)
        assert metric == fmt_metric(t["metric"], d)
        # a trial line has the digits the run had needed by then: as many as the files, or fewer
        assert line_metric(line) in {fmt_metric(t["metric"], k) for k in range(4, d + 1)}, (line, d)
        assert f"trial {n}:" in page  # every dot in the plot carries its trial number
    # the summary, report.md and search.html state the plan's shares as report.json has them
    shares = (f"{round(report['low_precision_flop_share'] * 100)}% of matmul/conv FLOPs "
              f"({round(report['low_precision_call_share'] * 100)}% of op calls) in {report['dtype']}")
    md = (out / "report.md").read_text()
    assert shares in res.stdout and shares in md and shares in page
    for key in ("baseline_metric", "target"):
        assert fmt_metric(report[key], d) in res.stdout and fmt_metric(report[key], d) in md
    assert f"{report['evaluations']} evaluations" in res.stdout
    return report


def test_numbers_agree_when_the_target_is_met(runner, tmp_path):
    pytest.importorskip("sklearn")
    out = tmp_path / "out"
    res = tune(runner, EXAMPLES / "digits_sensor.py", out)
    assert res.exit_code == 0, res.output
    report = check_agreement(res, out)
    chosen = report["chosen_trial"]
    assert chosen is not None and "pass" in trial_lines(res.stdout)[chosen]
    line = trial_lines(res.stdout)[chosen]
    assert f"{round(report['low_precision_flop_share'] * 100)}% FLOPs" in line  # the plan's share, on its line
    assert run_digits(report) == 4 and f"metric {fmt_metric(report['final_metric']):>8}" in line
    assert f"tuned {fmt_metric(report['final_metric'])}" in res.stdout and f"trial {chosen}" in res.stdout
    page = (out / "search.html").read_text()
    assert 'class="chosen"' in page and "chosen plan" in page and "0.9851851851851852" not in page
    md = (out / "report.md").read_text()
    assert "target met" in md and "tuner.load(build_model()" in md
    assert all(f"`{i}`" in md for i in report["fp32_instances"][:5])


def test_numbers_agree_on_a_searched_model(runner, tmp_path):
    model = tmp_path / "planted.py"
    shutil.copy(ASSETS / "planted_model.py", model)
    out = tmp_path / "out"
    res = tune(runner, model, out, "--thorough")
    assert res.exit_code == 0, res.output
    report = check_agreement(res, out)
    assert report["evaluations"] > 2  # the baseline, all-low and search trials


def test_a_tight_tolerance_shows_the_digits_that_tell_a_miss(runner, tmp_path):
    """At a target 1e-5 below the baseline, no output rounds a trial onto the target (issue: `FAIL metric 1`,
    `baseline 1 -> tuned 1 (target 1)`): terminal, summary, report.md and search.html use the same digits."""
    model = tmp_path / "tight.py"
    shutil.copy(ASSETS / "tight_model.py", model)
    out = tmp_path / "out"
    res = tune(runner, model, out, "--tolerance", "9.9e-6", "--max-evals", "5")
    report = check_agreement(res, out)
    d = run_digits(report)
    assert d > 4
    target, base = fmt_metric(report["target"], d), fmt_metric(report["baseline_metric"], d)
    assert target != base and f"target {target}" in (out / "search.html").read_text()
    assert f"| target | {target} |" in (out / "report.md").read_text()
    assert f"(target {target})" in res.stdout or f"no plan reached {target}" in res.stdout
    lines = trial_lines(res.stdout)
    for t in report["trials"]:
        if t["metric"] is not None and t["metric"] != report["target"]:
            shown = line_metric(lines[t["n"]])
            assert shown != target and float(shown) != float(target), (lines[t["n"]], target)


def test_report_md_is_committed_with_the_outputs():
    assert "report.md" in COMMITTED and "report.md" in OUTPUT_FILES and COMMITTED[-1] == "plan.yaml"

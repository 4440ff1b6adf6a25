"""search.html and report.md open with the run's facts and say why each FP32 instance is needed; the plot's
trial numbers never overlap."""
import itertools
import re
from pathlib import Path

import pytest

from tuner.core.loader import load_user_model
from tuner.jobs.tune_run import tune_into_folder
from tuner.options.tune import TuneOptions
from tuner.report.labels import place_labels

PLANTED = str(Path(__file__).parents[1] / "assets" / "planted_model.py")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("pages") / "out"
    return tune_into_folder(load_user_model(PLANTED), TuneOptions(tolerance=0.002), out, latency=False)


def test_search_page_states_model_date_time_and_why_each_fp32_instance(run):
    page = (run.out / "search.html").read_text()
    assert "<title>mpt tune: planted_model.py in bf16</title>" in page
    facts = dict(re.findall(r"<dt>(.*?)</dt><dd>(.*?)</dd>", page))
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", facts["date"])
    assert re.fullmatch(r"\d+\.\d s", facts["total time"])
    assert facts["evaluations"].startswith(f"{run.result.evals} (chosen: trial {run.result.chosen})")
    assert facts["forward latency"] == "not timed"
    fp32 = [i.label() for i in run.result.plan.fp32_instances]
    assert fp32 and f"FP32 op instances ({len(fp32)} of {len(run.result.candidates)})" in page
    failed = {t.n for t in run.result.trials if not t.passed}
    for label in fp32:
        row = re.search(rf"<tr><td><code>{re.escape(label)}</code></td><td>trial (\d+) failed with it in bf16.*?"
                        r'<td class="num">([\d.e-]+)</td><td class="num">([\d.]+)%</td>', page)
        assert row, label
        assert int(row.group(1)) in failed  # the evidence is a trial that failed with it lowered
        assert float(row.group(2)) == pytest.approx(run.result.scores[label], rel=1e-2)
        assert float(row.group(3)) == pytest.approx(100 * run.result.flop_shares[label], abs=0.06)


def test_report_md_is_a_pr_comment_with_a_real_header(run):
    text = (run.out / "report.md").read_text()
    lines = text.splitlines()
    assert lines[0] == "### mpt tune: `planted_model.py` in bf16 — ✅ target met"
    assert f"{len(run.result.plan.fp32_instances)} of {len(run.result.candidates)} op instances in FP32" in lines[2]
    assert "| result | value |" in lines and "| | |" not in lines  # no empty header row
    trial_rows = [ln for ln in lines if re.match(r"\| \d+ \| ", ln)]
    assert len(trial_rows) == run.result.evals
    assert all(ln.count(" | ") == 4 for ln in trial_rows)  # a '|' in a label cannot break the table
    for row in trial_rows:  # the `*` of compressed paths is escaped: no emphasis but the (chosen) mark
        assert not re.search(r"(?<!\\)\*(?!\*)", row.replace("**(chosen)**", "")), row
    assert text.count("<details>") == text.count("</details>") == 2


def test_plot_labels_never_overlap_even_when_dots_crowd():
    points = {(700 + (i % 3), 60 + 2 * i): [i + 3] for i in range(12)}  # a crowd near the top right corner
    points[(100, 300)] = [1, 2]
    placed = place_labels(points, (78, 56, 736, 382))
    assert sorted(p.text for p in placed) == sorted([",".join(map(str, ns)) for ns in points.values()])
    for a, b in itertools.combinations(placed, 2):
        ax0, ay0, ax1, ay1 = a.box()
        bx0, by0, bx1, by1 = b.box()
        assert ax1 <= bx0 or bx1 <= ax0 or ay1 <= by0 or by1 <= ay0, (a, b)


def test_search_page_labels_are_the_placed_ones(run):
    page = (run.out / "search.html").read_text()
    spots = re.findall(r'<text x="(\d+)" y="(\d+)" text-anchor="\w+" font-size="11">([\d,-]+)</text>', page)
    numbers = sorted(int(n) for _, _, text in spots for n in text.split(",") if "-" not in text)
    assert numbers == list(range(1, run.result.evals + 1))
    assert len({(x, y) for x, y, _ in spots}) == len(spots)

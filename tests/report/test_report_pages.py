"""search.html and report.md open with the run's facts and say why each FP32 instance is needed; the plot's
trial numbers never overlap."""
import html
import itertools
import re
from pathlib import Path

import pytest

from tuner.core.loader import load_user_model
from tuner.jobs.tune_run import tune_into_folder
from tuner.options.tune import TuneOptions
from tuner.report.labels import PlacedLabel, marker_box, overlap, place_labels

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
                        r'<td class="num">([\d.e+-]+)%</td><td class="num">([\d.]+)%</td>', page)
        assert row, label
        assert int(row.group(1)) in failed  # the evidence is a trial that failed with it lowered
        assert float(row.group(2)) == pytest.approx(100 * run.result.scores[label], rel=1e-2)
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


def _assert_apart(placed, markers):
    for a, b in itertools.combinations(placed, 2):
        assert not overlap(a.box(), b.box()), (a, b)
    for label in placed:
        for m in markers:
            assert not overlap(label.box(), m), (label, m)


def test_plot_labels_never_overlap_a_label_or_a_marker_even_when_dots_crowd():
    points = {(700 + (i % 3), 60 + 2 * i): [i + 3] for i in range(12)}  # a crowd near the top right corner
    points[(100, 300)] = [1, 2]
    # a crowd in the middle: a column of dots 9 px apart, each the near spots of its neighbours' labels
    points.update({(400 + 4 * (i % 2), 150 + 9 * i): [20 + i] for i in range(10)})
    chosen = marker_box(404, 177, 11.5)  # a diamond among them
    placed = place_labels(points, (78, 56, 736, 382), [chosen])
    assert sorted(p.text for p in placed) == sorted([",".join(map(str, ns)) for ns in points.values()])
    _assert_apart(placed, [marker_box(cx, cy) for cx, cy in points] + [chosen])
    for label in placed:
        x0, y0, x1, y1 = label.box()
        assert 78 <= x0 and x1 <= 736 and 56 <= y0 and y1 <= 382, label


def test_plot_labels_stay_near_their_dot_when_there_is_room():
    placed = place_labels({(300, 200): [7]}, (78, 56, 736, 382))
    assert placed == [PlacedLabel("7", 309, 192, "start")]  # the first spot: right of and above the dot


def test_search_page_labels_are_the_placed_ones(run):
    page = (run.out / "search.html").read_text()
    spots = re.findall(r'<text x="(\d+)" y="(\d+)" text-anchor="\w+" font-size="11">([\d,-]+)</text>', page)
    numbers = sorted(int(n) for _, _, text in spots for n in text.split(",") if "-" not in text)
    assert numbers == list(range(1, run.result.evals + 1))
    assert len({(x, y) for x, y, _ in spots}) == len(spots)


def test_search_page_labels_cover_no_dot_and_no_other_label(run):
    page = (run.out / "search.html").read_text()
    plot = page[page.index("<svg"):page.index("</svg>")]
    spots = re.findall(r'<text x="(\d+)" y="(\d+)" text-anchor="(\w+)" font-size="11">([\d,-]+)</text>', plot)
    placed = [PlacedLabel(text, float(x), float(y), anchor) for x, y, anchor, text in spots]
    centres = re.findall(r'<circle cx="([\d.]+)" cy="([\d.]+)" r="5"', plot)
    dots = [marker_box(float(cx), float(cy)) for cx, cy in centres]
    assert len(dots) >= run.result.evals and placed
    _assert_apart(placed, dots)


def test_report_md_load_snippet_runs_as_printed(run, monkeypatch):
    """report.md's snippet imports the model file's build_model itself: pasted as it is, it loads the tuned model."""
    import sys

    import tuner

    snippet = (run.out / "report.md").read_text().split("```python\n")[1].split("```")[0]
    assert "from planted_model import build_model" in snippet
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "planted_model", raising=False)
    scope: dict = {}
    try:
        exec(snippet, scope)
        evaluate = sys.modules["planted_model"].evaluate
    finally:
        sys.modules.pop("planted_model", None)
    assert tuner.attached(scope["model"]) is not None
    assert evaluate(scope["model"]) == run.result.metric  # the tuned model, as the tune measured it


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    """A tune of three planted culprits: the search keeps the three FP32 after the all-low trial fails, and
    lowers one of them alone once, so only that one has a trial of its own."""
    out = tmp_path_factory.mktemp("kept") / "out"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MPT_TEST_FRAGILE", "3")
        model = load_user_model(PLANTED)
    return tune_into_folder(model, TuneOptions(tolerance=0.002), out, latency=False)


def test_why_fp32_rows_name_the_trial_that_isolated_the_op_or_say_it_had_none(kept):
    """A row blames a trial only when that trial lowered nothing else of the plan; an op kept FP32 with the
    others when the all-low trial failed says first, plainly, that no trial tested it alone (not 'trial 2
    failed with it')."""
    result = kept.result
    plan = {i.label() for i in result.plan.fp32_instances}
    trials = {t.n: t for t in result.trials}
    text = (kept.out / "report.md").read_text()
    rows = dict(re.findall(r"^\| `(.+?)` \| (.+?) \|", text, re.M))
    assert set(rows) == plan and len(plan) == 3
    own = [label for label, why in rows.items() if why.endswith("(only change from the plan)")]
    for label in own:
        n = int(re.match(r"trial (\d+) failed with it in bf16", rows[label]).group(1))
        assert not trials[n].passed and set(trials[n].fp32) == plan - {label}
    none = [label for label in plan if label not in own]
    assert none, rows  # the search kept some without a trial of their own
    all_low = next(t.n for t in result.trials if not t.baseline and not t.fp32)
    for label in none:
        assert rows[label] == (f"no trial tested it in bf16 alone; kept FP32 with 2 other instances when trial "
                               f"{all_low} failed with all 3 in bf16 (every candidate lowered)")
    page = (kept.out / "search.html").read_text()
    assert page.count("no trial tested it in bf16 alone") == len(none)


def test_a_module_tried_as_one_unit_is_proved_by_the_trial_that_lowered_that_module_alone():
    """The search tries a module's ops together: a failed trial lowering exactly `attn`'s two instances
    proves both, and an op it never isolated says so."""
    from tuner.measure.shares import Shares
    from tuner.policy.plan import OpInstance, Plan
    from tuner.report.reasons import fp32_reasons
    from tuner.search.results import Trial, TuneResult, TuneStatus

    inst = (OpInstance("attn", "linear", 0), OpInstance("attn", "linear", 1), OpInstance("mlp", "linear", 0))
    labels = tuple(i.label() for i in inst)

    def trial(n: int, fp32: tuple[str, ...], passed: bool) -> Trial:
        return Trial(n, "", fp32, 1.0, passed, 0.1, Shares())

    trials = [trial(1, (), False), trial(2, labels, True), trial(3, labels[2:], False)]
    result = TuneResult(Plan(fp32_instances=inst), TuneStatus.MET, 1.0, 0.9, 1.0, trials, 3, None, list(inst), {},
                        chosen=2)
    why = {r.label: (r.proved, r.text("bf16")) for r in fp32_reasons(result, trials)}
    assert why["attn:linear#0"] == why["attn:linear#1"] == (True, (
        "trial 3 failed with its module's 2 instances in bf16 (only change from the plan; a module's ops are "
        "tried together)"))
    assert why["mlp:linear#0"] == (False, "no trial tested it in bf16 alone; kept FP32 with 2 other instances when "
                                          "trial 1 failed with all 3 in bf16 (every candidate lowered)")


def test_every_fp32_row_is_backed_by_a_trial_that_ran_it_low_or_says_plainly_that_none_did():
    """Issue 46: a row that names a trial ('trial K failed with it') names a failed trial that ran this op in
    bf16 with every other FP32 op of the plan still FP32 (the only change, or more FP32 than the plan: lowering
    it from the plan fails all the more); any other row says first that no trial tested it alone."""
    from tuner.measure.shares import Shares
    from tuner.policy.plan import OpInstance, Plan
    from tuner.report.reasons import fp32_reasons
    from tuner.search.results import Trial, TuneResult, TuneStatus

    inst = tuple(OpInstance(m, "linear", 0) for m in ("a", "b", "c", "d", "e"))
    a, b, c, d, e = (i.label() for i in inst)

    def trial(n: int, fp32: tuple[str, ...], passed: bool) -> Trial:
        return Trial(n, "", fp32, 1.0, passed, 0.1, Shares())

    trials = [trial(1, (), False), trial(2, (a, b, c, d), True), trial(3, (b, c, d), False),
              trial(4, (a, c, d, e), False), trial(5, (a, b), False)]
    plan = inst[:4]  # a b c d FP32; e low (trial 2, chosen)
    result = TuneResult(Plan(fp32_instances=plan), TuneStatus.MET, 1.0, 0.9, 1.0, trials, 5, None, list(inst), {},
                        chosen=2)
    rows = {r.label: r.text("bf16") for r in fp32_reasons(result, trials)}
    assert set(rows) == {a, b, c, d}
    by_n = {t.n: t for t in trials}
    for label, text in rows.items():
        named = re.match(r"trial (\d+) failed with it in bf16", text)
        if named:
            t = by_n[int(named.group(1))]
            assert not t.passed and label not in t.fp32 and {x for x in rows if x != label} <= set(t.fp32), text
        else:
            assert text.startswith("no trial tested it in bf16 alone; kept FP32 with"), text
    assert rows[a] == "trial 3 failed with it in bf16 (only change from the plan)"
    assert rows[b] == ("trial 4 failed with it in bf16, the plan's other FP32 instances FP32 and 1 more (no trial "
                       "lowered it from the plan itself)")
    assert rows[c] == rows[d] == ("no trial tested it in bf16 alone; kept FP32 with 1 other instance when trial 5 "
                                  "failed with all 2 in bf16")


def test_search_page_has_an_error_column_only_when_a_trial_raised(kept, tmp_path):
    """No empty `error` column in a run whose evaluate never raised; where a trial's evaluate raised, the
    column holds that trial's error (and only that trial's)."""
    from tests.cli.test_bad_input import model_file

    quiet = (kept.out / "search.html").read_text()
    assert "error</th>" not in quiet and "</td><td></td></tr>" not in quiet
    path = model_file(tmp_path, {"evaluate": """
        def evaluate(model):
            with torch.no_grad():
                out = model(torch.ones(3, 4))
            if out.dtype != torch.float32:
                raise ValueError(f"expected float32 logits, got {out.dtype}")
            return 1.0
        """})
    run = tune_into_folder(load_user_model(str(path)), TuneOptions(), tmp_path / "out", latency=False)
    page = (run.out / "search.html").read_text()
    assert "<th>evaluate error</th>" in page
    raised = [t for t in run.result.trials if t.error]
    assert raised and all("expected float32 logits, got torch.bfloat16" in t.error for t in raised)
    for t in run.result.trials:
        row = re.search(rf"<tr(?: class=\"chosen\")?><td>{t.n}</td>.*?</tr>", page).group(0)
        assert row.endswith(f"<td>{html.escape(t.error)}</td></tr>" if t.error else "<td></td></tr>"), row
    # report.md's trials table says why a trial failed too (a fp16 LossScaler's StepsSkipped, issue 41)
    assert "| fail: evaluate raised ValueError: expected float32 logits, got torch.bfloat16" in \
        (run.out / "report.md").read_text()


def test_the_score_column_says_what_it_measures_in_which_unit(kept):
    """Not a bare `score`: the column is the output error with that op alone in bf16, in percent, and a line
    under the table says how it is measured."""
    md = (kept.out / "report.md").read_text()
    page = (kept.out / "search.html").read_text()
    assert "| op instance | why FP32 | output error, alone in bf16 | FLOP share |" in md
    assert "<th>output error, alone in bf16</th>" in page and "<th>score</th>" not in page
    for text in (md, html.unescape(page)):
        assert "output error, alone in bf16: how much the model's output" in text
        assert "with only that op instance in bf16, its inputs as it receives them" in text
        assert "(‖Δoutput‖ / ‖output‖, in percent)" in text
    for label, score in kept.result.scores.items():
        if any(i.label() == label for i in kept.result.plan.fp32_instances):
            shown = re.search(rf"^\| `{re.escape(label)}` \| .+? \| ([\d.e+-]+)%(?: \(first-order estimate\))? \| ",
                              md, re.M).group(1)
            assert float(shown) == pytest.approx(100 * score, rel=1e-2)

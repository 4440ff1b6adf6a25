"""`mpt tune`'s renderer words the events' typed payloads; piped, one plain line per event."""
from __future__ import annotations

from mpt_cli.tune_cmd import _Renderer
from tuner.search.results import (
    BaselineMeasured,
    CandidatesFound,
    Evaluating,
    EventKind,
    RankMethod,
    RankProgress,
    TuneEvent,
)


def rendered(capsys, *events: TuneEvent) -> list[str]:
    render = _Renderer(quiet=False)
    for event in events:
        render(event)
    return capsys.readouterr().out.splitlines()


def test_baseline_and_candidates_lines(capsys):
    lines = rendered(capsys, TuneEvent(EventKind.BASELINE, BaselineMeasured(0.985185, 0.0, 0.975333, False)),
                     TuneEvent(EventKind.BASELINE, BaselineMeasured(2.5, 0.0123, 2.7, True)),
                     TuneEvent(EventKind.CANDIDATES, CandidatesFound(5, "bf16", "torch-cpu", 0.99412)))
    assert lines == ["baseline 0.9852; target >= 0.9753",
                     "baseline 2.500 (noise: FP32 runs spread over 0.0123; a trial must clear the target by more); "
                     "target <= 2.700",
                     "5 op instances run in bf16 under torch-cpu and change the numbers; all-bf16 output error "
                     "9.94e-01"]


def test_ranking_is_announced_once_with_its_method_and_evaluating_is_silent_when_piped(capsys):
    lines = rendered(capsys, *(TuneEvent(EventKind.RANK, RankProgress(RankMethod.GRADIENT, n, 3)) for n in (1, 2, 3)),
                     TuneEvent(EventKind.RANK, RankProgress(RankMethod.EXACT, 1, 3)),
                     TuneEvent(EventKind.EVALUATING, Evaluating(3, "all eligible in bf16")))
    assert lines == ["ranking op instances on example inputs (gradient: one shadowed forward pass + backward probes)",
                     "ranking op instances on example inputs (exact: one forward pass per op instance)"]


def test_quiet_prints_nothing(capsys):
    render = _Renderer(quiet=True)
    render(TuneEvent(EventKind.BASELINE, BaselineMeasured(1.0, 0.0, 0.99, False)))
    assert capsys.readouterr().out == ""


def test_a_long_trial_line_on_a_120_column_terminal_folds_its_label_between_words():
    """On a terminal a trial's label wraps inside its own column: each line fits 120 columns, every next line
    starts under the label's first, and no word is cut (the label's words come back whole, in order)."""
    import io

    from rich.console import Console

    from tuner.measure.shares import Shares
    from tuner.search.results import Trial

    label = ("+6 FP32: 0.auto_model.encoder.layer.*.attention.self:linear#0 ×3, "
             "0.auto_model.encoder.layer.*.intermediate.intermediate_act_fn:gelu#0 ×3; 6 FP32 (8 tried, "
             "2 change nothing)")
    render = _Renderer(quiet=False)
    buf = io.StringIO()
    render.tty, render.out = True, Console(file=buf, width=120, force_terminal=True, color_system=None)
    render.trial(Trial(4, label, (), 0.981234, False, 12.5, Shares(100, 40, 1000, 870)))
    lines = buf.getvalue().splitlines()
    assert len(lines) > 1 and all(len(line) <= 120 for line in lines), lines
    column = lines[0].index("+6 FP32:")
    assert lines[0].startswith("eval   4  FAIL") and all(line[:column].isspace() for line in lines[1:]), lines
    assert [w for line in lines for w in line[column:].split()] == label.split()

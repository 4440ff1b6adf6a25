"""Metrics written with the digits that tell them from the target and the baseline (tuner.report.metric_text)."""
import math

from tuner.report.metric_text import MetricDigits, fmt_metric, metric_digits


def test_four_digits_when_they_suffice():
    assert metric_digits(0.9851851851851852, 0.9753333333333334, [0.9851851851851852, 0.98148]) == 4
    assert fmt_metric(0.9851851851851852) == "0.9852" and fmt_metric(None) == "-"


def test_a_tight_tolerance_gets_the_digits_that_show_the_miss():
    baseline, target, tuned = 1.0, 0.99999, 0.9999866  # the run: it printed "1 -> 1 (target 1)"
    d = metric_digits(baseline, target, [tuned])
    assert d == 6
    assert (fmt_metric(baseline, d), fmt_metric(tuned, d), fmt_metric(target, d)) == ("1.00000", "0.999987",
                                                                                        "0.999990")
    assert metric_digits(baseline, target) == 5  # the target alone needs one digit more than 4


def test_equal_missing_and_non_finite_values_ask_for_nothing():
    assert metric_digits(0.5, 0.25, [0.5, 0.25, None, math.nan, math.inf]) == 4
    assert metric_digits(None, None, [0.123456789]) == 4


def test_running_digits_end_where_the_whole_run_does():
    values = [1.0, 1.0, 0.99999005, 0.9999957, 0.9999925]
    run = MetricDigits()
    seen = [run.add(v) for v in values[:2]]
    seen.append(run.set_reference(1.0, 0.9999901))
    seen += [run.add(v) for v in values[2:]]
    assert seen == sorted(seen)  # never fewer digits than an earlier line
    assert seen[-1] == metric_digits(1.0, 0.9999901, values) == 7
    assert fmt_metric(0.99999005, 7) != fmt_metric(0.9999901, 7)


def test_every_metric_of_a_run_shows_its_digits_trailing_zeros_kept():
    """`metric 1` and `FAIL 0.1` beside `0.9922` read as if less were known of them: each keeps the run's digits."""
    d = metric_digits(0.9922, 0.9823, [1.0, 0.1])
    assert [fmt_metric(v, d) for v in (0.9922, 1.0, 0.1, 1234.0)] == ["0.9922", "1.000", "0.1000", "1234"]

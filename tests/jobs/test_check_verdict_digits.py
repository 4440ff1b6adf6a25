"""`mpt check`'s verdict line writes its metrics as every output does (tuner.report.metric_text)."""
from tuner.jobs.check_run import CheckResult


def result(metric: float, baseline: float, target: float, passed: bool) -> CheckResult:
    return CheckResult(passed=passed, metric=metric, baseline=baseline, target=target, tolerance=1e-5,
                       absolute=False, lower_is_better=False, plan="p", model="m", dtype="bf16", preset="torch-cpu",
                       weights="fresh")


def test_a_tight_tolerance_shows_the_miss():
    line = result(0.9999866, 1.0, 0.99999, passed=False).verdict()
    assert line.startswith("check: FAIL 0.999987 < target 0.999990 (baseline 1.00000, tolerance 0.001%")


def test_four_digits_where_they_suffice():
    line = result(0.9851851851851852, 0.9851851851851852, 0.9753333333333334, passed=True).verdict()
    assert line == "check: PASS 0.9852 >= target 0.9753 (baseline 0.9852, tolerance 0.001%)"


def test_a_tolerance_given_instead_of_the_plans_is_named():
    given = CheckResult(passed=True, metric=0.9, baseline=1.0, target=0.5, tolerance=0.5, absolute=False,
                        lower_is_better=False, plan="p", model="m", dtype="bf16", preset="torch-cpu",
                        weights="fresh", plan_tolerance=0.01)
    assert "(baseline 1.000, tolerance 50% given, the plan's 1%)" in given.verdict()

"""Latency is judged, not just printed: the decision rule on synthetic timing samples (no timing assertions on
real runs), the thread count pinned for both sides, and report.json's `latency_ms` keeping its keys."""
from __future__ import annotations

import random

import pytest
import torch
from torch import nn

from tuner.core.inputs import ModelInputs
from tuner.policy.plan import OpInstance, Plan
from tuner.report.latency import BOUND, FASTER, NOISY, SAME, SLOWER, Latency, compare_latency, judge


def _rounds(fp32_ms: float, tuned_ms: float, noise: float, n: int, seed: int = 0) -> tuple[list[float], list[float]]:
    """n paired rounds (seconds) around the given medians, each sample off by up to `noise` (relative)."""
    rng = random.Random(seed)
    jitter = lambda: 1 + rng.uniform(-noise, noise)  # noqa: E731
    return ([fp32_ms * 1e-3 * jitter() for _ in range(n)], [tuned_ms * 1e-3 * jitter() for _ in range(n)])


def test_a_clear_tight_speedup_is_stated_with_its_figure():
    lat = judge(*_rounds(2.0, 1.0, 0.02, 50))
    assert lat.verdict == FASTER and lat.judged and not lat.slower
    assert lat.speedup_low is not None and lat.speedup_high is not None
    assert lat.speedup_low <= lat.speedup <= lat.speedup_high and lat.spread <= BOUND
    assert lat.text().startswith(f"{lat.tuned:.2f} ms vs {lat.fp32:.2f} ms FP32 (") and "x faster" in lat.text()


def test_a_speedup_whose_interval_overlaps_one_is_no_measurable_difference():
    lat = judge(*_rounds(1.0, 1.0, 0.04, 40))
    assert lat.verdict == SAME and lat.judged and not lat.slower
    assert lat.speedup_low < 1 < lat.speedup_high
    assert lat.text() == f"{lat.tuned:.2f} ms vs {lat.fp32:.2f} ms FP32 (no measurable difference)"
    # within MIN_EFFECT of 1.0 however tight: 1% slower is no difference, nor a warning
    tight = judge([1.0e-3] * 20, [1.01e-3] * 20)
    assert tight.spread == 0 and tight.verdict == SAME and not tight.slower


def test_a_tight_slowdown_is_slower_and_the_warning_rule():
    lat = judge(*_rounds(1.0, 1.5, 0.02, 50))
    assert lat.verdict == SLOWER and lat.slower and lat.speedup_high < 1
    assert "x slower" in lat.text() and f"{1 / lat.speedup:.2f}x" in lat.text()


def test_stalls_on_a_busy_machine_are_too_noisy_to_judge_and_give_no_figure():
    """The issue's case: a 0.05 ms model where some calls of either side stall for tens of milliseconds
    gave `24.03 ms vs 39.92 ms FP32`. Its interval is wide: no speedup, no figure, no slower warning."""
    rng = random.Random(3)
    stall = lambda: 0.05e-3 if rng.random() < 0.5 else rng.uniform(20e-3, 80e-3)  # noqa: E731
    fp32_s, tuned_s = [stall() for _ in range(12)], [stall() for _ in range(12)]
    lat = judge(fp32_s, tuned_s)
    assert lat.verdict == NOISY and not lat.judged and not lat.slower
    assert lat.spread > BOUND
    text = lat.text()
    assert text.startswith("too noisy to judge (") and " ms" not in text and "x " not in text
    assert f"within a factor of {1 + lat.spread:.3g}, more than the 1.1 allowed" in text and "%" not in text


def test_a_wide_interval_reads_as_a_factor_not_thousands_of_percent():
    wide = Latency(1.0, 1.0, 1.0, 0.5, 0.5, 35, speedup_low=0.05, speedup_high=6.649)
    assert wide.verdict == NOISY
    assert wide.text() == ("too noisy to judge (the speedup is known only within a factor of 133, more than the "
                           "1.1 allowed, after 35 rounds)")


def test_the_verdict_follows_the_stated_bound():
    fp32_s, tuned_s = _rounds(2.0, 1.0, 0.15, 30, seed=1)
    wide = judge(fp32_s, tuned_s).spread
    assert wide is not None and wide > 0
    assert judge(fp32_s, tuned_s, bound=wide * 0.9).verdict == NOISY
    assert judge(fp32_s, tuned_s, bound=wide * 1.1).verdict == FASTER


def test_unpaired_rounds_are_refused():
    with pytest.raises(ValueError, match="paired"):
        judge([1e-3, 1e-3], [1e-3])
    with pytest.raises(ValueError, match="paired"):
        judge([], [])


def test_latency_ms_keeps_its_keys_and_adds_the_verdict():
    d = judge(*_rounds(2.0, 1.0, 0.02, 20), threads=3).to_dict()
    assert {"fp32", "tuned", "speedup", "fp32_spread", "tuned_spread", "rounds", "order", "tuned_weights"} <= set(d)
    assert d["verdict"] == FASTER and d["threads"] == 3 and d["bound"] == BOUND
    assert d["speedup_low"] <= d["speedup"] <= d["speedup_high"] and d["speedup_spread"] >= 0


class _ThreadGrabber(nn.Module):
    """Records the thread count each forward starts with, then leaves torch on one thread."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 2)
        self.seen: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(torch.get_num_threads())
        torch.set_num_threads(1)
        return self.fc(x)


def test_compare_latency_pins_the_thread_count_for_both_sides_and_has_the_structure():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        model = _ThreadGrabber().eval()
        plan = Plan(dtype="bf16", preset="torch-cpu", fp32_instances=(OpInstance("fc", "linear", 0),))
        lat = compare_latency(model, plan, ModelInputs.of((torch.randn(4, 8),)), min_time=0.0, max_time=0.2,
                              min_rounds=6)
        assert torch.get_num_threads() == 2  # left as found
    finally:
        torch.set_num_threads(before)
    assert set(model.seen) == {2} and len(model.seen) == 2 * lat.rounds + 2  # warm-ups and rounds alike
    assert lat.threads == 2 and lat.rounds >= 6 and lat.verdict in (FASTER, SLOWER, SAME, NOISY)
    assert lat.speedup_low is not None and lat.speedup_high is not None and lat.speedup_low <= lat.speedup_high
    assert lat.to_dict()["verdict"] == lat.verdict and lat.seconds > 0


class _Slow(nn.Module):
    """A forward that takes at least `seconds` (sleeps), so the budget rule is met whatever the machine."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.lin, self.seconds = nn.Linear(4, 4), seconds

    def forward(self, x):
        import time
        time.sleep(self.seconds)
        return self.lin(x)


def test_a_forward_too_long_for_the_budget_is_not_timed_after_one_call():
    from tuner.report.latency import MIN_FORWARDS, TooSlowToTime

    calls = []
    model = _Slow(0.05)
    model.register_forward_pre_hook(lambda *a: calls.append(1))
    with pytest.raises(TooSlowToTime) as info:
        compare_latency(model, Plan(dtype="bf16", preset="torch-cpu"), (torch.randn(2, 4),), budget=0.05 * 2)
    assert len(calls) == 1 and info.value.forward_s >= 0.05 and f"the {MIN_FORWARDS} forwards" in str(info.value)


class _SlowTuned(nn.Module):
    """FP32 forwards take `fp32` seconds, forwards with a plan attached `tuned` (sleeps): a lower precision
    far slower than FP32, as bf16 is on a CPU without bf16 kernels."""

    def __init__(self, fp32: float, tuned: float) -> None:
        super().__init__()
        self.lin, self.fp32, self.tuned = nn.Linear(4, 4), fp32, tuned
        self.calls: list[bool] = []

    def forward(self, x):
        import time

        from tuner.engine.attach import attached

        on = attached(self) is not None
        self.calls.append(on)
        time.sleep(self.tuned if on else self.fp32)
        return self.lin(x)


def test_a_tuned_forward_too_long_for_the_budget_is_not_timed_after_the_warm_ups():
    from tuner.report.latency import TooSlowToTime

    model = _SlowTuned(0.01, 0.1)  # the FP32 warm-up alone fits: 8 x 0.01 s < 0.3 s; 4 pairs do not
    with pytest.raises(TooSlowToTime) as info:
        compare_latency(model, Plan(dtype="bf16", preset="torch-cpu"), (torch.randn(2, 4),), budget=0.3)
    assert model.calls == [False, True] and "one tuned forward" in str(info.value)
    assert info.value.forward_s >= 0.1


def test_the_budget_holds_for_the_whole_timing_with_at_least_three_rounds():
    from tuner.report.latency import MIN_ROUNDS

    # 5 pairs fit in 0.26 s (warm-ups included); the 7 rounds asked for do not. The 4 pairs a verdict needs
    # (0.16 s) leave room for sleeps that overrun on a loaded machine.
    model = _SlowTuned(0.01, 0.03)
    lat = compare_latency(model, Plan(dtype="bf16", preset="torch-cpu"), (torch.randn(2, 4),), budget=0.26,
                          min_rounds=7, min_time=10.0)
    assert MIN_ROUNDS == 3 and len(model.calls) == 2 * lat.rounds + 2
    assert MIN_ROUNDS <= lat.rounds < 7  # no round started that would end past the budget

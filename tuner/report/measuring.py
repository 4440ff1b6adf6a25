"""The measuring step of writing a tune's outputs: everything the report needs from the model, once.

One recorded forward under the chosen plan gives the plan's shares and the
parameters the checkpoint stores lowered (`plan_pass`); the latency is timed
on the same model with the plan attached and detached in turn; one more
attach tells how `tuner.load` will run the plan here. The model is the FP32
model as built and is left as it was (no copy is made).
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import time
from collections.abc import Callable

from torch import nn

from tuner.core.inputs import ModelInputs
from tuner.engine.attach import attach, attached, detach
from tuner.engine.native import Execution
from tuner.measure.deployed import Holding, stored_as
from tuner.policy.plan import ModelRef, Plan
from tuner.report.checkpoint import plan_pass, verify_plan_pass
from tuner.report.latency import MIN_FORWARDS, Latency, TooSlowToTime, compare_latency
from tuner.report.oplists import type_level
from tuner.report.outcome import TuneReport
from tuner.search.results import TuneResult, TuneStatus


def measure_report(result: TuneResult, model: nn.Module, *, model_ref: ModelRef | None = None, device: str = "cpu",
                   latency: bool = True, decide: Callable[[bool], bool] | None = None,
                   hold: Holding = stored_as, as_built: Callable[[], nn.Module] | None = None) -> TuneReport:
    """The TuneReport of `result`'s plan on `model` (see the module docstring); nothing is written.

    `model_ref` is the model the plan was made for, recorded in the plan.
    `latency=False` skips the timing (`latency` is None, report.json's `latency_ms` null).
    A sharded model is measured by every rank together (its forwards are collective): `decide` is rank 0's
    decision broadcast, so the timing stops on every rank at once (`compare_latency`). `hold`: how the
    verifying forward holds the lowered parameters (`deployed.Holding`); it runs after the timing, which
    needs the FP32 weights, so a holding that stays (the tune's keeper) is packed once for it and the checkpoint.
    `as_built`: `model` with its FP32 weights (the keeper's `model`, which puts back what it holds lowered),
    asked for only by a forward that needs them; default `model` itself. So a report whose forwards the tune
    ran already (the all-low plan's) leaves the trials' lowered weights held for the checkpoint.
    """
    t0 = time.monotonic()
    inputs = ModelInputs() if result.inputs is None else ModelInputs.of(result.inputs)
    fp32 = as_built or (lambda: model)
    planned = plan_pass(fp32() if result.lowered is None or result.recorded is None else model, result.plan, inputs,
                        lowered=result.lowered, recorded=result.recorded)
    # the list files' plan, and what it costs where it is not this one: recorded while the model holds its FP32
    # weights (the verify below may leave them held lowered, which a recorded forward of another plan cannot run)
    lists = type_level(result.plan, fp32, inputs, recorded=result.recorded)  # (the tune's record of the plan)
    warnings = list(result.warnings)
    timing = _latency(fp32, result, inputs, device, warnings, decide) if latency else None
    seen = result.deployed if result.deployed is not None and planned.lowered == result.lowered else None
    # what the report claims is what ran, and loads: seen in the evaluation that confirmed the plan, or a forward
    verify_plan_pass(model, result.plan, inputs, planned, hold=hold, seen=seen)
    plan = dataclasses.replace(result.plan, model=model_ref)
    # the chosen trial's shares as measured under the final plan: the same numbers as the summary's
    trials = tuple(dataclasses.replace(t, shares=planned.shares) if t.n == result.chosen else t
                   for t in result.trials)
    execution = _execution(model, plan)
    return TuneReport(plan=plan, shares=planned.shares, trials=trials, latency=timing, execution=execution,
                      warnings=tuple(warnings), lowered=planned.lowered, seconds=time.monotonic() - t0, lists=lists,
                      device=device, created=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))


def _execution(model: nn.Module, plan: Plan) -> Execution:
    """How `tuner.load` will run this plan on this machine (native, scoped or python), from one attach."""
    attach(model, plan)
    try:
        ex = attached(model)
    finally:
        detach(model)
    assert ex is not None
    return ex


LATENCY_SECONDS = 3.0  # the timing's budget: this many seconds, or LATENCY_SHARE of the evaluations' time
LATENCY_SHARE = 0.02  # of a large model's tune (issue 20: mpt's own time at most 15% of it, every phase included)


KNOWN_MARGIN = 2.0  # skip without a forward only when the baseline's pace is twice too slow (it includes the metric)


def _forward_seconds(result: TuneResult, inputs: ModelInputs) -> tuple[float, float, float] | None:
    """(seconds a forward of the example inputs took, as a share of the FP32 baseline's evaluate; how many
    times the example inputs' elements that evaluate fed the model; its seconds), None where not counted.
    An upper bound (the evaluate's own work is in it): enough to skip a timing that cannot fit, with no
    forward spent to learn it (1.1B parameters: a second)."""
    example = inputs.elements()
    base = next((t for t in result.trials if t.baseline and t.fed and not t.from_journal), None)
    if base is None or not base.fed or not example:
        return None
    times = base.fed / example
    return base.seconds / times, times, base.seconds


def _latency(fp32: Callable[[], nn.Module], result: TuneResult, inputs: ModelInputs, device: str,
             warnings: list[str], decide: Callable[[bool], bool] | None = None) -> Latency | None:
    """compare_latency for the report, and the warnings it calls for (None when the tuned model raised)."""
    budget = max(LATENCY_SECONDS, LATENCY_SHARE * result.eval_seconds)
    decide = decide or (lambda stop: stop)
    known = _forward_seconds(result, inputs)
    if decide(known is not None and known[0] * MIN_FORWARDS > KNOWN_MARGIN * budget):
        if known is None:  # a sharded model's other rank, told by rank 0 (which writes the warning)
            return None
        forward_s, times, seconds = known
        warnings.append(f"the tuned model was not timed: the FP32 baseline's evaluate fed the model {times:.0f} "
                        f"times the example inputs in {seconds:.1f} s, about {forward_s:.2f} s a forward, so the "
                        f"{MIN_FORWARDS} forwards a verdict needs would take longer than the {budget:.1f} s budget "
                        f"(at most {LATENCY_SHARE:.0%} of the time spent in evaluate, or {LATENCY_SECONDS:g} s); "
                        "time it on your own data, or pass --no-latency")
        return None
    try:
        timing = compare_latency(fp32(), result.plan, inputs, device=device, budget=budget, decide=decide)
    except TooSlowToTime as slow:
        warnings.append(f"the tuned model was not timed: {slow} (at most {LATENCY_SHARE:.0%} of the time spent "
                        f"in evaluate, or {LATENCY_SECONDS:g} s); time it on your own data, or pass --no-latency")
        return None
    except Exception as exc:  # noqa: BLE001 - the outputs are still worth writing; say why there is no timing
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        warnings.append(f"the tuned model raised when run the way tuner.load runs it, so it was not timed: "
                        f"{type(exc).__name__}: {first}")
        return None
    # the verdict's rule (latency.py): only a slowdown measured clear of 1.0, within the bound, is warned of
    if timing.slower and result.status is TuneStatus.MET:  # not met: the plan is all FP32
        warnings.append(f"the tuned model ran slower than FP32 on {device} ({timing.tuned:.2f} ms vs "
                        f"{timing.fp32:.2f} ms per forward on example_inputs): {result.plan.dtype} does not pay "
                        "off here (slow lower-precision kernels, or a model too small for casts to be worth it)")
    return timing

"""`tuner.tune`: the accuracy-driven search for per-instance FP32 fallbacks.

Flow: FP32 baseline -> record which op instances run in the lower precision
(the candidates) -> rank them with cheap forward passes (the final output's
error when only that instance runs low) -> FallbackSearch with full
evaluations -> a Plan confirmed by a full evaluation.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from .api import attach, detach
from .audit import relative_error
from .dtypes import LOWER_DTYPES, parse_dtype, short_name
from .engine import Decision, PrecisionEngine
from .errors import ConfigError, UserCodeError
from .flops import op_flops
from .journal import Journal
from .plan import OpInstance, Plan
from .policy import load_preset
from .ranking import rank_exact, rank_gradient
from .search import FallbackSearch, SearchOutcome

DEFAULT_PRESET = {"cpu": "torch-cpu", "cuda": "torch-cuda"}


@dataclass(frozen=True)
class TuneOptions:
    """What to search for. Validated on construction."""

    dtype: str = "bf16"
    preset: str | None = None  # None: torch-cpu on CPU, torch-cuda on CUDA
    tolerance: float = 0.01
    absolute: bool = False
    lower_is_better: bool = False
    max_evals: int | None = None
    time_budget: float | None = None
    device: str = "cpu"
    thorough: bool = False
    rank: str = "gradient"  # "gradient" (one pass) or "exact" (one forward per op instance)

    def __post_init__(self) -> None:
        problems = []
        if self.rank not in ("gradient", "exact"):
            problems.append(f"rank: expected gradient or exact, found {self.rank!r}")
        try:
            object.__setattr__(self, "dtype", short_name(parse_dtype(self.dtype, lower_only=True)))
        except ValueError as exc:
            problems.append(f"dtype: {exc}")
        if self.device not in ("cpu", "cuda"):
            problems.append(f"device: expected cpu or cuda, found {self.device!r}")
        if not isinstance(self.tolerance, (int, float)) or isinstance(self.tolerance, bool) or \
                not math.isfinite(self.tolerance) or self.tolerance < 0:
            problems.append(f"tolerance: expected a number >= 0, found {self.tolerance!r}")
        elif not self.absolute and self.tolerance >= 1:
            problems.append(f"tolerance: a relative tolerance must be below 1 (found {self.tolerance}); "
                            "use absolute: true for an absolute drop")
        if self.max_evals is not None and (not isinstance(self.max_evals, int) or self.max_evals < 2):
            problems.append(f"max_evals: expected an integer >= 2 (baseline + one trial), found {self.max_evals!r}")
        if self.time_budget is not None and (not isinstance(self.time_budget, (int, float)) or self.time_budget <= 0):
            problems.append(f"time_budget: expected seconds > 0, found {self.time_budget!r}")
        if problems:
            raise ConfigError(problems, source="tune options")
        if self.preset is None:
            object.__setattr__(self, "preset", DEFAULT_PRESET[self.device])
        load_preset(self.preset)  # raises ConfigError with suggestions

    def target(self, baseline: float) -> float:
        slack = self.tolerance if self.absolute else self.tolerance * abs(baseline)
        return baseline + slack if self.lower_is_better else baseline - slack

    def meets(self, metric: float | None, target: float) -> bool:
        if metric is None or not math.isfinite(metric):
            return False
        return metric <= target if self.lower_is_better else metric >= target


@dataclass(frozen=True)
class Trial:
    n: int
    label: str
    fp32: tuple[str, ...]
    metric: float | None
    passed: bool
    seconds: float
    low_share: float
    error: str | None = None
    from_journal: bool = False


@dataclass(frozen=True)
class TuneEvent:
    """Progress for a renderer: kind is baseline | candidates | rank | trial | done."""

    kind: str
    message: str = ""
    trial: Trial | None = None
    done: int = 0
    total: int = 0


@dataclass
class TuneResult:
    plan: Plan
    status: str  # "ok" | "not_met"
    baseline: float
    target: float
    metric: float | None
    trials: list[Trial]
    evals: int
    stopped: str | None
    candidates: list[OpInstance]
    scores: dict[str, float]
    notes: list[str] = field(default_factory=list)
    call_share: float = 0.0
    seconds: float = 0.0
    eval_seconds: float = 0.0
    user_seconds: float = 0.0  # the user's build() and example_inputs(), besides evaluate
    inputs: tuple | None = None
    warnings: list[str] = field(default_factory=list)


def _key(fp32: frozenset[OpInstance] | None) -> str:
    if fp32 is None:
        return "baseline"
    return "fp32=" + ",".join(sorted(i.label() for i in fp32))


class _InputRecorder:
    """Keeps the positional args of the model's first forward call (when the file has no example_inputs)."""

    def __init__(self, model: nn.Module) -> None:
        self.args: tuple | None = None
        self.handle = model.register_forward_pre_hook(self._hook)

    def _hook(self, module: nn.Module, args: tuple) -> None:
        if self.args is None:
            self.args = tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args)
        self.handle.remove()


def _to_float(value: Any) -> float:
    if isinstance(value, torch.Tensor):
        return float(value.detach().cpu().item())
    return float(value)


def tune(build: Callable[[], nn.Module] | nn.Module, evaluate: Callable[[nn.Module], Any],
         example_inputs: Callable[[], tuple] | tuple | None = None, options: TuneOptions | None = None, *,
         journal: Journal | None = None, on_event: Callable[[TuneEvent], None] | None = None) -> TuneResult:
    """Find the op instances that must stay FP32 for `evaluate(model)` to stay within tolerance.

    `build` is the FP32 model or a function that builds it; `evaluate(model)`
    returns the metric (a number or a one-element tensor). A trial whose
    metric is NaN/inf or whose evaluate raises fails and the search moves on;
    the baseline raising propagates. Like INC's `autotune(model, config, eval_fn)`.
    """
    options = options or TuneOptions()
    if isinstance(build, nn.Module):
        import copy

        template = build
        build = lambda: copy.deepcopy(template)  # noqa: E731
    emit = on_event or (lambda e: None)
    t_start = time.monotonic()
    dtype = parse_dtype(options.dtype)
    device = torch.device(options.device)
    t_user = time.monotonic()
    model = build().to(device).eval()
    user_seconds = time.monotonic() - t_user
    policy = load_preset(options.preset)  # type: ignore[arg-type]
    trials: list[Trial] = []
    eval_seconds = 0.0
    count = 0

    # 1. Baseline (FP32).
    rec = _InputRecorder(model) if example_inputs is None else None
    cached = journal.get("baseline") if journal else None
    if cached is not None:
        baseline, secs = float(cached["metric"]), float(cached["seconds"])
        from_journal = True
    else:
        t0 = time.monotonic()
        baseline = _to_float(evaluate(model))
        secs = time.monotonic() - t0
        from_journal = False
        if baseline is None or not math.isfinite(baseline):
            raise UserCodeError(f"evaluate returned {baseline} for the FP32 model; the baseline must be finite")
        if journal:
            journal.append("baseline", {"metric": baseline, "seconds": secs, "passed": True})
    eval_seconds += secs
    count += 1
    target = options.target(baseline)
    base_trial = Trial(0, "FP32 baseline", (), baseline, True, secs, 0.0, None, from_journal)
    trials.append(base_trial)
    emit(TuneEvent("baseline", f"baseline {baseline:.6g}; target {'<=' if options.lower_is_better else '>='} "
                   f"{target:.6g}", trial=base_trial))

    if isinstance(example_inputs, tuple):
        inputs = example_inputs
    elif callable(example_inputs):
        t_user = time.monotonic()
        inputs = example_inputs()
        user_seconds += time.monotonic() - t_user
    else:
        if rec is None or rec.args is None:
            if rec is not None:
                rec.handle.remove()
            # Resumed run with no recorded inputs: record them with one plain forward via evaluate.
            rec = _InputRecorder(model)
            evaluate(model)
        inputs = rec.args  # type: ignore[assignment]
        if inputs is None:
            raise ConfigError("no example_inputs() and evaluate never called the model; cannot rank op instances")
    inputs = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in inputs)

    # 2. Candidates: op instances that compute in the lower precision under the preset.
    decisions: list[tuple[Decision, int]] = []

    def record(d: Decision, func: Any, args: tuple, kwargs: dict, out: Any, *raw: Any) -> None:
        decisions.append((d, op_flops(d.op, args, kwargs, out)))

    with torch.no_grad():
        ref_out = model(*inputs)
        with PrecisionEngine(policy, dtype, root=model, recorder=record):
            low_out = model(*inputs)
    lower_names = {short_name(d) for d in LOWER_DTYPES}
    float_calls = [d for d, _ in decisions if d.compute != "-"]
    candidates = [OpInstance(d.module, d.op, d.index) for d in float_calls
                  if d.compute in lower_names and not d.reason.startswith(("in-place", "out=", "explicit"))]
    total_calls = max(1, len(float_calls))
    emit(TuneEvent("candidates", f"{len(candidates)} op instances run in {options.dtype} under {options.preset}; "
                   f"all-{options.dtype} output error {relative_error(low_out, ref_out) or 0:.2e}",
                   total=len(candidates)))

    # 3. Rank (only when the all-low trial failed): each instance's damage to the final output.
    scores: dict[OpInstance, float] = {}

    def rank() -> list[int]:
        def progress(done: int, total: int) -> None:
            emit(TuneEvent("rank", options.rank, done=done, total=total))

        scorer = rank_gradient if options.rank == "gradient" else rank_exact
        scores.update(scorer(model, inputs, policy, dtype, candidates, ref_out, progress))
        return sorted(range(len(candidates)), key=lambda i: (-scores[candidates[i]], i))

    # 4. Search with full evaluations.
    memo: dict[frozenset[int], bool] = {}
    def run_trial(fp32_idx: frozenset[int], label: str) -> bool:
        nonlocal eval_seconds, count
        if fp32_idx in memo:  # asked again by the search: already counted and reported
            return memo[fp32_idx]
        fp32 = frozenset(candidates[i] for i in fp32_idx)
        key = _key(fp32)
        share = (len(candidates) - len(fp32)) / total_calls
        cached = journal.get(key) if journal else None
        if cached is not None:
            metric = cached.get("metric")
            metric = None if metric is None else float(metric)
            trial = Trial(len(trials), label, tuple(sorted(i.label() for i in fp32)), metric,
                          bool(cached["passed"]), float(cached["seconds"]), share, cached.get("error"), True)
        else:
            plan = Plan(dtype=options.dtype, preset=options.preset, fp32_instances=tuple(sorted(fp32)))  # type: ignore[arg-type]
            attach(model, plan, engine="python")
            t0 = time.monotonic()
            error = None
            metric: float | None
            try:
                metric = _to_float(evaluate(model))
            except UserCodeError as exc:
                metric, error = None, str(exc)
            except Exception as exc:  # noqa: BLE001 - a failed trial, not a crash
                metric, error = None, f"evaluate raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            finally:
                detach(model)
            secs = time.monotonic() - t0
            if metric is not None and not math.isfinite(metric):
                error = f"metric is {metric}"
            passed = options.meets(metric, target)
            trial = Trial(len(trials), label, tuple(sorted(i.label() for i in fp32)), metric, passed, secs, share,
                          error)
            if journal:
                journal.append(key, {"metric": metric if metric is None or math.isfinite(metric) else str(metric),
                                     "passed": passed, "seconds": secs, "error": error,
                                     "fp32": list(trial.fp32)})
        eval_seconds += trial.seconds
        count += 1
        trials.append(trial)
        emit(TuneEvent("trial", trial=trial, done=count))
        memo[fp32_idx] = trial.passed
        return trial.passed

    def test(fp32_idx: frozenset[int]) -> bool:
        if not fp32_idx:
            label = f"all eligible in {options.dtype}"
        else:
            names = [candidates[i].label() for i in sorted(fp32_idx, key=lambda i: (-scores.get(candidates[i], 0), i))]
            label = f"{len(names)} in FP32: " + ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")
        return run_trial(fp32_idx, label)


    if test(frozenset()):  # everything eligible in the lower precision passes: no ranking needed
        outcome = SearchOutcome(frozenset(), count, None, ["everything eligible passes in the lower precision"])
    elif options.max_evals is not None and count >= options.max_evals:
        outcome = SearchOutcome(None, count, f"--max-evals {options.max_evals} reached")
    else:
        ranked = rank()
        search = FallbackSearch(ranked, [scores[candidates[i]] for i in ranked], test,
                                max_evals=options.max_evals, time_budget=options.time_budget,
                                thorough=options.thorough, evals_used=lambda: count)
        outcome = search.run()

    best_trial = None
    if outcome.fp32 is not None:
        best_labels = tuple(sorted(candidates[i].label() for i in outcome.fp32))
        best_trial = next((t for t in reversed(trials) if t.passed and t.fp32 == best_labels and t.n > 0), None)
    if best_trial is None:  # fall back to the smallest confirmed passing trial
        passing = [t for t in trials if t.passed and t.n > 0]
        best_trial = min(passing, key=lambda t: len(t.fp32)) if passing else None
    if best_trial is not None:
        by_label = {c.label(): c for c in candidates}
        fp32_final = tuple(sorted(by_label[l] for l in best_trial.fp32))
        status, metric = "ok", best_trial.metric
    else:
        fp32_final = tuple(sorted(candidates))
        status, metric = "not_met", None
    plan = Plan(dtype=options.dtype, preset=options.preset, fp32_instances=fp32_final,  # type: ignore[arg-type]
                metrics={"baseline": baseline, "tuned": metric, "target": target, "tolerance": options.tolerance,
                         "absolute": options.absolute, "lower_is_better": options.lower_is_better,
                         "evaluations": count, "candidates": len(candidates)})
    notes = list(outcome.notes)
    if outcome.stopped:
        notes.append(f"search cut short: {outcome.stopped}; the best confirmed plan so far was kept")
    result = TuneResult(plan=plan, status=status, baseline=baseline, target=target, metric=metric, trials=trials,
                        evals=count, stopped=outcome.stopped, candidates=candidates,
                        scores={c.label(): s for c, s in scores.items()}, notes=notes,
                        call_share=(len(candidates) - len(fp32_final)) / total_calls,
                        seconds=time.monotonic() - t_start, eval_seconds=eval_seconds, user_seconds=user_seconds,
                        inputs=inputs)
    emit(TuneEvent("done", "target met" if status == "ok" else "target not met"))
    return result

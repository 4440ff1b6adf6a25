"""One tune, as an object whose methods are its phases.

    baseline -> candidates -> all-low trial -> ranking -> search -> result

`TuneSession._evaluate` is the one place that runs `evaluate`: it checks the
bounds (evaluations, time from the start of the command), reads and writes
the journal, counts, reports the trial and hands the model back as built
(`isolation.ModelKeeper`). A bound or an interrupt (Ctrl-C, SIGTERM) ends the
search and the result keeps the best plan confirmed so far. Every trial runs
the model with its plan attached as `tuner.load` attaches it, so the plan the
search approves is the one that is deployed.
"""
from __future__ import annotations

import copy
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tuner.core.dtypes import parse_dtype
from tuner.core.errors import ConfigError, Interrupted, UserCodeError
from tuner.core.inputs import ModelInputs
from tuner.core.loader import call_forward
from tuner.engine.attach import attach, autocast, detach
from tuner.engine.function_mode import Decision, PrecisionEngine
from tuner.engine.kind import EngineKind
from tuner.engine.probe import autocast_failures
from tuner.measure.flops import first_tensor, op_flops
from tuner.measure.inspection import relative_error
from tuner.measure.ranking import rank_exact, rank_gradient
from tuner.measure.shares import ShareCounter, Shares
from tuner.policy.opnames import is_neutral
from tuner.policy.plan import OpInstance, Plan
from tuner.policy.presets import load_preset
from tuner.policy.rules import Rule
from tuner.search.distributed import Ranks, SharedJournal
from tuner.search.noise import Acceptance, Baseline, measure_baseline
from tuner.search.strategy import PrecisionSearch, Probe, SearchStopped
from tuner.search.types import EventKind, RankMethod, StopReason, Trial, TuneEvent, TuneOptions, TuneResult, TuneStatus
from tuner.workspace.journal import Journal
from tuner.workspace.keeper import ModelKeeper

BASELINE_KEY = "baseline#{n}"


def _trial_key(fp32: frozenset[OpInstance]) -> str:
    return "fp32=" + ",".join(sorted(i.label() for i in fp32))


def _to_float(value: Any) -> float:
    if isinstance(value, torch.Tensor):
        return float(value.detach().cpu().item())
    return float(value)


class _InputRecorder:
    """Keeps the args and kwargs of the model's first forward call (when there is no example_inputs)."""

    def __init__(self, model: nn.Module) -> None:
        self.inputs: ModelInputs | None = None
        self.handle = model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if self.inputs is None:
            self.inputs = ModelInputs(tuple(args), dict(kwargs)).snapshot()
        self.handle.remove()


# Rules under which an op runs in its inputs' precision: with FP32 inputs an FP32 override changes nothing.
_FROM_INPUTS = frozenset({Rule.PASSTHROUGH, Rule.FIRST_INPUT, Rule.PROMOTE})


class TuneSession:
    def __init__(self, build: Callable[[], nn.Module], evaluate: Callable[[nn.Module], Any],
                 example_inputs: Callable[[], tuple] | tuple | None, options: TuneOptions, *,
                 journal: Journal | SharedJournal | None = None,
                 on_event: Callable[[TuneEvent], None] | None = None, started: float | None = None,
                 keeper: ModelKeeper | None = None, ranks: Ranks | None = None) -> None:
        self.options = options
        self.dtype = parse_dtype(options.dtype)
        self.policy = load_preset(options.preset)  # type: ignore[arg-type]
        self.evaluate_fn = evaluate
        self.inputs_source = example_inputs
        self.journal = journal
        self.ranks = ranks or Ranks()  # under torchrun: rank 0 decides, the others follow (tuner.search.distributed)
        self.emit = (on_event if self.ranks.is_main else None) or (lambda e: None)  # only rank 0 reports
        self.started = time.monotonic() if started is None else started
        t0 = time.monotonic()
        self.keeper = keeper or ModelKeeper(build, options.device)
        self.user_seconds = time.monotonic() - t0 if keeper is None else 0.0
        self.trials: list[Trial] = []
        self.evals = 0
        self.eval_seconds = 0.0
        self.stopped: StopReason | None = None
        self.notes: list[str] = []
        self.warnings: list[str] = []
        self.base: Baseline | None = None
        self.accept: Acceptance | None = None
        self.inputs: ModelInputs | None = None
        self.candidates: list[OpInstance] = []
        self.costs: dict[OpInstance, float] = {}
        self.cand_flops: dict[OpInstance, int] = {}  # matmul/conv FLOPs of each candidate (tuner.measure.flops)
        self.all_low = Shares()  # the forward under the preset with every candidate lowered (find_candidates)
        self.scores: dict[OpInstance, float] = {}
        self.fp32_modules: dict[str, str] = {}  # modules torch.autocast cannot run here -> why
        self._memo: dict[frozenset[int], Probe] = {}
        self._recorder: _InputRecorder | None = None
        self._search_best: frozenset[int] | None = None

    # --- the phases ------------------------------------------------------------------------------------------
    def run(self) -> TuneResult:
        self.measure_baseline()
        try:
            self.find_candidates()
            self.search()
        except SearchStopped as stop:
            self.stopped = stop.reason  # type: ignore[assignment]
        except (KeyboardInterrupt, Interrupted):
            self.stopped = StopReason.INTERRUPTED
        if self.stopped is not None:
            self.keeper.restore()  # an interrupted evaluate may have left the model changed
        return self.result()

    def measure_baseline(self) -> None:
        """The FP32 metric, evaluated twice to learn whether `evaluate` is deterministic (tuner.search.noise)."""
        if self.inputs_source is None:
            self.inputs = self.journal.load_inputs() if self.journal else None
            if self.inputs is None:
                self._recorder = _InputRecorder(self.keeper.model)
        base = measure_baseline(self._baseline_sample)
        if self._recorder is not None:  # every sample came from the journal and the inputs were not kept
            base = Baseline(base.samples + (self._baseline_sample(),))
        self.base = base
        target = self.options.target(base.value)
        self.accept = Acceptance(target, base.spread, self.options.lower_is_better)
        self._note_noise(base)
        relation = "<=" if self.options.lower_is_better else ">="
        noise = f" (noise ±{base.spread:.3g}: a trial must clear the target by more)" if base.noisy else ""
        self.emit(TuneEvent(EventKind.BASELINE, f"baseline {base.value:.6g}{noise}; target {relation} {target:.6g}",
                            trial=self.trials[-1]))

    def _baseline_sample(self) -> float:
        n = sum(t.baseline for t in self.trials) + 1
        trial = self._evaluate(BASELINE_KEY.format(n=n), f"FP32 baseline run {n}", frozenset(), baseline=True)
        rec = self._recorder
        if rec is not None and rec.inputs is not None:
            self.inputs, self._recorder = rec.inputs, None
            if self.journal and not self.journal.save_inputs(self.inputs):
                self.notes.append("the recorded inputs are not all tensors, so they are not kept for --resume")
        if trial.metric is None:  # pragma: no cover - _evaluate raises for a failed baseline
            raise UserCodeError("evaluate gave no metric for the FP32 model")
        return trial.metric

    def _note_noise(self, base: Baseline) -> None:
        if not base.noisy:
            return
        self.notes.append(f"evaluate is not deterministic: {len(base.samples)} FP32 runs spread over "
                          f"{base.spread:.3g}; a plan must clear the target by more than that")
        if base.spread >= self.options.slack(base.value):
            self.warnings.append(f"the metric's noise ({base.spread:.3g}) is as large as the tolerance allows "
                                 f"({self.options.slack(base.value):.3g}): no plan can be confirmed; make "
                                 "evaluate deterministic (fixed seeds, no dropout) or raise the tolerance")

    def find_candidates(self) -> None:
        """Op instances whose precision changes the numbers, from one recorded forward under the preset.

        Not candidates: calls the policy cannot choose for (in-place, explicit dtype=), calls that run in
        FP32 anyway, numerically neutral ops (views, copies, eval-mode dropout: `opnames.is_neutral`), and
        calls inside modules that torch.autocast cannot run on this machine (they stay FP32, see
        `deploy.autocast_failures`).
        """
        inputs = self._example_inputs()
        model = self.keeper.model
        self.fp32_modules = autocast_failures(model, inputs, self._plan(frozenset()))
        self.keeper.restore()
        for path, why in self.fp32_modules.items():
            self.notes.append(f"module {path or '(root)'} stays FP32: torch.autocast cannot run it in "
                              f"{self.options.dtype} on this machine ({why})")
        counter = ShareCounter()

        def record(d: Decision, func: Any, args: tuple, kwargs: dict, out: Any, *raw: Any) -> None:
            counter.add(d, args, kwargs, out)
            # a neutral op that casts (a lower-list op rounding an FP32 input) does change the numbers
            if d.lowered and not d.forced and (d.casts > 0 or not is_neutral(d.op, args, kwargs)):
                y = first_tensor(out)
                cand = OpInstance(d.module, d.op, d.index)
                self.cand_flops[cand] = op_flops(d.op, args, kwargs, out)
                self.costs[cand] = float(self.cand_flops[cand] + (y.numel() if y is not None else 0))

        with torch.no_grad():
            self.ref_out = call_forward(model, inputs)
            with PrecisionEngine(self.policy, self.dtype, root=model, recorder=record,
                                 module_overrides={p: torch.float32 for p in self.fp32_modules}):
                low_out = call_forward(model, inputs)
        self.candidates = list(self.costs)
        self.all_low = counter.shares
        self.emit(TuneEvent(EventKind.CANDIDATES,
                            f"{len(self.candidates)} op instances run in {self.options.dtype} under "
                            f"{self.options.preset} and change the numbers; all-{self.options.dtype} output error "
                            f"{relative_error(low_out, self.ref_out) or 0:.2e}", total=len(self.candidates)))

    def _example_inputs(self) -> ModelInputs:
        source = self.inputs_source
        if callable(source):
            t0 = time.monotonic()
            inputs = source()
            self.user_seconds += time.monotonic() - t0
        elif source is not None:
            inputs = source
        elif self.inputs is not None:
            inputs = self.inputs
        else:
            raise ConfigError("there is no example_inputs() and evaluate never called the model; "
                              "cannot find the op instances to tune")
        self.inputs = ModelInputs.of(inputs).to(self.keeper.device)
        return self.inputs

    def search(self) -> None:
        """The all-low trial; when it fails, rank the candidates and let PrecisionSearch pick the FP32 units.

        The search decides per module, not per call: a unit is every candidate one module's own code calls,
        which is what a loaded plan can run in FP32 without Python per op (`tuner.engine.native`).
        """
        first = self._trial(frozenset())
        if first.passed:
            self._search_best = frozenset()
            self.notes.append("everything eligible passes in the lower precision")
            return
        if not self.candidates:
            return
        self.rank()
        units = self.units()
        search = PrecisionSearch([math.sqrt(sum(self.scores[self.candidates[i]] ** 2 for i in u)) for u in units],
                                 lambda picked: self._trial(frozenset(i for n in picked for i in units[n])),
                                 costs=[sum(self.costs[self.candidates[i]] for i in u) for u in units],
                                 thorough=self.options.thorough, all_low_failed=True, all_low_drop=first.drop)
        outcome = search.run()
        if outcome.fp32 is not None:
            self._search_best = frozenset(i for n in outcome.fp32 for i in units[n])
        self.notes.extend(outcome.notes)
        if outcome.stopped is not None:
            self.stopped = outcome.stopped  # type: ignore[assignment]

    def units(self) -> list[tuple[int, ...]]:
        """Candidate indices grouped by the module that calls them, in the order modules first call one."""
        groups: dict[str, list[int]] = {}
        for i, cand in enumerate(self.candidates):
            groups.setdefault(cand.module, []).append(i)
        return [tuple(g) for g in groups.values()]

    def rank(self) -> None:
        """Score every candidate by the error it adds to the output, from cheap passes on the example inputs."""
        method = RankMethod(self.options.rank)

        def progress(done: int, total: int) -> None:
            self.emit(TuneEvent(EventKind.RANK, method.value, done=done, total=total))

        scorer = rank_gradient if method is RankMethod.GRADIENT else rank_exact
        assert self.inputs is not None
        self.ranks.same([c.label() for c in self.candidates], "op instances to tune")
        scores = scorer(self.keeper.model, self.inputs, self.policy, self.dtype, self.candidates, self.ref_out,
                        progress)
        self.scores.update(self.ranks.broadcast(scores))  # every rank searches in rank 0's order
        self.keeper.restore()

    # --- evaluations -----------------------------------------------------------------------------------------
    def _trial(self, fp32_idx: frozenset[int]) -> Probe:
        """One search trial: the candidates in `fp32_idx` stay FP32, the rest run low."""
        fp32_idx = self.ranks.broadcast(fp32_idx)  # under torchrun every rank tests what rank 0's search asks
        if fp32_idx in self._memo:  # asked again by the search: already counted and reported
            return self._memo[fp32_idx]
        fp32 = frozenset(self.candidates[i] for i in fp32_idx)
        try:
            trial = self._evaluate(_trial_key(fp32), self._label(fp32_idx), fp32)
        except (KeyboardInterrupt, Interrupted):
            raise SearchStopped(StopReason.INTERRUPTED) from None
        probe = Probe(trial.passed, self._drop(trial.metric))
        self._memo[fp32_idx] = probe
        return probe

    def _drop(self, metric: float | None) -> float:
        """How far `metric` fell from the baseline, as a share of the drop the target allows (1.0: at it)."""
        assert self.base is not None and self.accept is not None
        allowed = abs(self.base.value - self.accept.target)
        if metric is None or not math.isfinite(metric) or allowed == 0:
            return math.inf
        fell = metric - self.base.value if self.options.lower_is_better else self.base.value - metric
        return fell / allowed

    def _plan(self, fp32: frozenset[OpInstance], **extra: Any) -> Plan:
        return Plan(dtype=self.options.dtype, preset=self.options.preset,  # type: ignore[arg-type]
                    modules=tuple(sorted((p, "fp32") for p in self.fp32_modules)),
                    fp32_instances=tuple(sorted(fp32)), **extra)

    def _label(self, fp32_idx: frozenset[int]) -> str:
        if not fp32_idx:
            return f"all eligible in {self.options.dtype}"
        weight: dict[str, float] = {}
        for i in fp32_idx:
            cand = self.candidates[i]
            weight[cand.module] = weight.get(cand.module, 0.0) + self.scores.get(cand, 0.0) ** 2
        names = [m or "(root)" for m in sorted(weight, key=lambda m: (-weight[m], m))]
        modules = f"{len(names)} module{'s' if len(names) > 1 else ''}" if len(names) > 1 else names[0]
        shown = ": " + ", ".join(names[:3]) + (" ..." if len(names) > 3 else "") if len(names) > 1 else ""
        return f"{len(fp32_idx)} in FP32 ({modules}){shown}"

    def _check_bounds(self) -> None:
        opts = self.options
        if opts.max_evals is not None and self.evals >= opts.max_evals:
            raise SearchStopped(StopReason.MAX_EVALS)
        if opts.time_budget is not None:
            took = [t.seconds for t in self.trials if not t.from_journal] or [0.0]
            if time.monotonic() - self.started + statistics.median(took) > opts.time_budget:
                raise SearchStopped(StopReason.TIME_BUDGET)

    def _evaluate(self, key: str, label: str, fp32: frozenset[OpInstance], *, baseline: bool = False) -> Trial:
        """Run (or read from the journal) one full evaluation; the only place `evaluate` is called."""
        labels = tuple(sorted(i.label() for i in fp32))
        share = Shares() if baseline else self.all_low.without(len(fp32), sum(self.cand_flops[c] for c in fp32))
        cached = self.journal.get(key) if self.journal else None
        if cached is not None:
            metric = None if cached.get("metric") is None else float(cached["metric"])
            trial = Trial(len(self.trials) + 1, label, labels, metric, self._passes(metric, baseline),
                          float(cached["seconds"]), share, cached.get("error"), True, baseline)
            return self._record(trial)
        if not baseline:
            self.ranks.decide(self._check_bounds)  # rank 0's clock and count stop every rank at once
        self.emit(TuneEvent(EventKind.EVALUATING, label, done=len(self.trials) + 1))
        metric, error, secs = self._run_evaluate(fp32, baseline)
        trial = Trial(len(self.trials) + 1, label, labels, metric, self._passes(metric, baseline), secs, share, error,
                      False, baseline)
        if self.journal:
            self.journal.append(key, {"metric": metric, "passed": trial.passed, "seconds": secs, "error": error,
                                      "fp32": list(labels)})
        return self._record(trial)

    def _run_evaluate(self, fp32: frozenset[OpInstance], baseline: bool) -> tuple[float | None, str | None, float]:
        model = self.keeper.model
        if not baseline:
            attach(model, self._plan(fp32))  # the path tuner.load runs: what the search approves, deploys
        t0 = time.monotonic()
        metric: float | None = None
        error: str | None = None
        try:
            metric = _to_float(self.evaluate_fn(model))
        except Exception as exc:  # noqa: BLE001 - the baseline re-raises; a trial fails
            if baseline or self.ranks.distributed:  # a rank cannot tell whether the others raised too: stop all
                raise
            error = str(exc) if isinstance(exc, UserCodeError) else \
                f"evaluate raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        finally:
            detach(model)
        secs = time.monotonic() - t0
        if metric is not None and self.ranks.distributed:
            metric = self.ranks.agree(metric)  # the metric that counts: the all-reduced one, alike on every rank
        if metric is not None and not math.isfinite(metric):
            if baseline:
                raise UserCodeError(f"evaluate returned {metric} for the FP32 model; the baseline must be finite")
            error, metric = f"metric is {metric}", None
        self.keeper.restore()
        return metric, error, secs

    def _passes(self, metric: float | None, baseline: bool) -> bool:
        if baseline:
            return True
        assert self.accept is not None
        return self.accept.confirms(metric)

    def _record(self, trial: Trial) -> Trial:
        self.evals += 1
        self.eval_seconds += trial.seconds
        self.trials.append(trial)
        self.emit(TuneEvent(EventKind.TRIAL, trial=trial, done=trial.n))
        return trial

    # --- the answer ------------------------------------------------------------------------------------------
    def _best_trial(self) -> Trial | None:
        """The search's answer when a passing trial confirmed it, else the smallest confirmed FP32 set."""
        passing = [t for t in self.trials if t.passed and not t.baseline]
        if self._search_best is not None:
            wanted = tuple(sorted(self.candidates[i].label() for i in self._search_best))
            found = [t for t in passing if t.fp32 == wanted]
            if found:
                return found[-1]
        return min(passing, key=lambda t: len(t.fp32)) if passing else None

    def _no_op_overrides(self, fp32: tuple[OpInstance, ...]) -> set[OpInstance]:
        """FP32 overrides that change nothing under the plan: ops that run in their inputs' precision and,
        with their producers in FP32, get only FP32 inputs. One recorded forward, no evaluation."""
        if not fp32 or self.inputs is None:
            return set()
        wanted = set(fp32)
        idle: set[OpInstance] = set()

        def record(d: Decision, *rest: Any) -> None:
            inst = OpInstance(d.module, d.op, d.index)
            if inst in wanted and self.policy.lookup(d.op)[0] in _FROM_INPUTS and d.in_dtypes \
                    and all(t is torch.float32 for t in d.in_dtypes):
                idle.add(inst)

        with torch.no_grad(), autocast(self._plan(frozenset(fp32)), model=self.keeper.model, recorder=record,
                                       engine=EngineKind.PYTHON):
            call_forward(self.keeper.model, self.inputs)
        self.keeper.restore()
        return idle

    def result(self) -> TuneResult:
        assert self.base is not None and self.accept is not None
        best = self._best_trial()
        if best is not None:
            by_label = {c.label(): c for c in self.candidates}
            fp32_final = tuple(sorted(by_label[label] for label in best.fp32))
            status, metric = TuneStatus.MET, best.metric
            idle = self._no_op_overrides(fp32_final) if self.stopped is not StopReason.INTERRUPTED else set()
            if idle:
                fp32_final = tuple(i for i in fp32_final if i not in idle)
                self.notes.append(f"{len(idle)} FP32 override(s) dropped: their inputs are FP32 under the plan, "
                                  "so they ran in FP32 anyway")
        else:
            fp32_final, status, metric = tuple(sorted(self.candidates)), TuneStatus.NOT_MET, None
        opts = self.options
        plan = self._plan(frozenset(fp32_final),
                          metrics={"baseline": self.base.value, "tuned": metric, "target": self.accept.target,
                                   "tolerance": opts.tolerance, "absolute": opts.absolute,
                                   "lower_is_better": opts.lower_is_better, "noise": self.base.spread,
                                   "evaluations": self.evals, "candidates": len(self.candidates),
                                   "status": status.value, "stopped": self.stopped.value if self.stopped else None})
        notes = list(self.notes)
        if self.stopped is not None:
            notes.append(f"search cut short: {self.stopped.describe(opts)}; the best plan confirmed so far was kept")
        return TuneResult(plan=plan, status=status, baseline=self.base.value, target=self.accept.target,
                          metric=metric, trials=self.trials, evals=self.evals, stopped=self.stopped,
                          candidates=self.candidates, scores={c.label(): s for c, s in self.scores.items()},
                          notes=notes,
                          seconds=time.monotonic() - self.started, eval_seconds=self.eval_seconds,
                          user_seconds=self.user_seconds, inputs=self.inputs, warnings=list(self.warnings),
                          noise=self.base.spread, rebuilds=self.keeper.rebuilds,
                          chosen=best.n if best is not None else None)


def tune(build: Callable[[], nn.Module] | nn.Module, evaluate: Callable[[nn.Module], Any],
         example_inputs: Callable[[], Any] | Any = None, options: TuneOptions | None = None, *,
         journal: Journal | None = None, on_event: Callable[[TuneEvent], None] | None = None,
         started: float | None = None) -> TuneResult:
    """Find the op instances that must stay FP32 for `evaluate(model)` to stay within tolerance.

    `build` is a function that builds the FP32 model (or the model itself, which
    then costs one extra copy: every trial starts from a fresh deep copy when
    evaluate changed it); `evaluate(model)` returns the metric (a number or a
    one-element tensor). A trial whose metric is NaN/inf or whose evaluate
    raises fails and the search moves on; the baseline raising propagates.
    `started` (time.monotonic()) is when the time budget starts; default now.
    Like INC's `autotune(model, config, eval_fn)`.
    """
    if isinstance(build, nn.Module):
        template = build
        build = lambda: copy.deepcopy(template)  # noqa: E731
    session = TuneSession(build, evaluate, example_inputs, options or TuneOptions(), journal=journal,
                          on_event=on_event, started=time.monotonic() if started is None else started)
    return session.run()

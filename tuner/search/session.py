"""One tune, as a short sequence of phases that hand values along.

    baseline -> candidates -> all-low trial -> ranking -> range rule -> search -> result

`Evaluator` (tuner.search.evaluator) is the one place that runs `evaluate`: it checks the bounds (evaluations,
time from the start of the command), reads and writes the journal, counts and reports the trials. Every use
of the model borrows it from the `ModelKeeper`, which hands it back as built. A bound or an interrupt (Ctrl-C,
SIGTERM) ends the search and the result keeps the best plan confirmed so far.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from tuner.core.dtypes import parse_dtype
from tuner.core.errors import ConfigError, Interrupted, UserCodeError
from tuner.core.heap import compact_heap
from tuner.core.inputs import ModelInputs, tensor_leaves
from tuner.core.loader import user_site
from tuner.core.sharding import Sharding
from tuner.core.torch_state import refuse_active_autocast
from tuner.engine.probe import AutocastFixes, autocast_fixes
from tuner.measure.ranges import RangeReason, RangeRecorder, RangeSide, beyond_range, follow_chains, record_ranges
from tuner.measure.ranking import rank_exact, rank_gradient
from tuner.measure.recorded import PlanRecord, record_plan
from tuner.options.tune import Granularity, RankMethod, TuneOptions
from tuner.policy.plan import OpInstance, Plan
from tuner.policy.presets import load_preset
from tuner.search.budget import FULL, MAX_PROBES, AidLimits, aid_limits
from tuner.search.builtin_metric import builtin_evaluate
from tuner.search.candidates import FORWARD, Candidates, find_candidates
from tuner.search.changes import Change
from tuner.search.distributed import Ranks, SharedJournal
from tuner.search.evaluator import Bounds, Evaluator
from tuner.search.guide import Guide
from tuner.search.noise import Acceptance, Baseline, coarse_metric_note, measure_baseline
from tuner.search.phases import Phase, PhaseClock
from tuner.search.plans import plan_for
from tuner.search.repeatable import repeatable, replaying
from tuner.search.results import (
    BaselineMeasured,
    CandidatesFound,
    EventKind,
    RankProgress,
    StopReason,
    Trial,
    TuneEvent,
    TuneResult,
    TuneStatus,
)
from tuner.search.strategy import PrecisionSearch, Probe, SearchOutcome, SearchStopped
from tuner.search.trials import SearchTrials, best_trial
from tuner.workspace.journal import Journal
from tuner.workspace.keeper import ModelKeeper
from tuner.workspace.reference import first_output_of

Scores = Mapping[OpInstance, float]
LowForward = tuple[float | None, float]  # the all-low plan's output error on the example inputs, and seconds

# An all-low output this far from the FP32 one (relative error) must move any metric computed from it.
UNSEEN_OUTPUT_ERROR = 0.5
_F32 = torch.float32
CHAIN_TRIALS = 2  # a fallback chain's trials past the search's: the FP32 units in the fallback dtype, then half


class _InputRecorder:
    """Keeps the args and kwargs of the model's first forward call (when there is no example_inputs)."""

    def __init__(self, model: nn.Module) -> None:
        self.inputs: ModelInputs | None = None
        self.handle = model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if self.inputs is None:
            self.inputs = ModelInputs(tuple(args), dict(kwargs)).snapshot()
        self.handle.remove()


class TuneSession:
    def __init__(self, build: Callable[[], nn.Module], evaluate: Callable[[nn.Module], Any],
                 example_inputs: Callable[[], Any] | Any, options: TuneOptions, *,
                 journal: Journal | SharedJournal | None = None,
                 on_event: Callable[[TuneEvent], None] | None = None, started: float | None = None,
                 keeper: ModelKeeper | None = None, ranks: Ranks | None = None,
                 fp32_output: Callable[[ModelInputs], Any] | None = None) -> None:
        self.options = options
        # the FP32 output on the example inputs where evaluate already computed it (a built-in metric's
        # reference pass: `FidelityEvaluate.first_output`), else None; the candidates phase runs no FP32 forward
        self.fp32_output = fp32_output
        self.dtype = parse_dtype(options.dtype)
        self.policy = load_preset(options.preset)  # type: ignore[arg-type]
        self.inputs_source = example_inputs
        self.journal = journal  # here for the recorded inputs; the evaluator keeps the trials in it
        self.ranks = ranks or Ranks()  # under torchrun: rank 0 decides, the others follow (tuner.search.distributed)
        self.emit = (on_event if self.ranks.is_main else None) or (lambda e: None)  # only rank 0 reports
        self.started = time.monotonic() if started is None else started
        t0 = time.monotonic()
        self.keeper = keeper or ModelKeeper(build, options.device, start=refuse_active_autocast("tuner.tune()"),
                                            before_build=replaying(build) if options.for_training else None)
        self.user_seconds = time.monotonic() - t0 if keeper is None else 0.0
        self.evaluator = Evaluator(evaluate, self.keeper, Bounds(self.started, options.max_evals, options.time_budget),
                                   journal=journal, ranks=self.ranks, emit=self.emit, training=options.for_training,
                                   seeds=options.seeds)
        self.clock = PhaseClock(lambda: self.evaluator.eval_seconds)
        self.notes: list[str] = []
        self.recorded: PlanRecord | None = None  # the written plan's recorded forward (final_fp32)
        self.lowered: dict[str, torch.dtype] | None = None  # what its plan's forward lowered (final_fp32)
        self.warnings: list[str] = []
        self.range_kept: dict[OpInstance, RangeReason] = {}  # what the range rule keeps FP32 (`range_rule`)
        # a fallback chain (`--fallback`): the other 16-bit dtype, what the range rule sends there, and the
        # candidates of the chosen plan that run there (`search`, `chain`)
        self.fallback = parse_dtype(options.fallback) if options.fallback is not None else None
        self.range_fallback: frozenset[OpInstance] = frozenset()
        self.chosen_fallback: frozenset[OpInstance] = frozenset()
        self.limits = FULL  # what the aids may spend (`aid_limits`); the report's measured estimates too

    # --- the phases ------------------------------------------------------------------------------------------
    def run(self) -> TuneResult:
        phase = self.clock.phase
        with phase(Phase.BASELINE):
            base, accept, inputs = self.measure_baseline()
        found: Candidates | None = None
        scores: Scores = {}
        chosen: frozenset[OpInstance] | None = None
        stopped: StopReason | None = None
        try:
            with phase(Phase.CANDIDATES):
                inputs = self.example_inputs(inputs)
                found = self.find_candidates(inputs)
            self.evaluator.inputs = found.inputs  # each trial holds lowered what its checkpoint would
            trials = SearchTrials(self.evaluator, found, base, accept, self.options)
            with phase(Phase.ALL_LOW):
                first, low = self.all_low(found, trials)
                base, accept, first = self.settle_noise(base, accept, trials, first)
                self.check_metric_sees_outputs(found, base)
            if first.passed:
                chosen = frozenset()
                self.notes.append("everything eligible passes in the lower precision")
            elif found.instances and not self._unconfirmable(base):  # else no evaluation could confirm a plan
                limits = self.limits = self.aid_limits(found, low)
                ranges = self.range_recorder(found, low)
                with phase(Phase.RANKING):
                    scores = self.rank(found, limits.probes, ranges)
                with phase(Phase.RANGE):
                    low = self.range_rule(found, low, ranges)
                with phase(Phase.SEARCH):
                    chosen, stopped = self.search(found, scores, trials, first, low, limits)
        except SearchStopped as stop:
            stopped = stop.reason  # type: ignore[assignment]
        except (KeyboardInterrupt, Interrupted):
            stopped = StopReason.INTERRUPTED
        with phase(Phase.RESULT):
            return self.result(base, accept, inputs, found, scores, chosen, stopped)

    def measure_baseline(self) -> tuple[Baseline, Acceptance, ModelInputs | None]:
        """The FP32 metric, evaluated once: the all-low trial then tells whether `evaluate` is deterministic
        (`settle_noise`, tuner.search.noise).

        Without example_inputs() the inputs come from the journal of an earlier run, else they are recorded
        from evaluate's first forward call (and kept in the journal for --resume)."""
        inputs = self.journal.load_inputs() if self.journal and self.inputs_source is None else None
        recorder = _InputRecorder(self.keeper.model) if self.inputs_source is None and inputs is None else None

        def sample() -> float:
            nonlocal inputs, recorder
            metric = self._fp32_metric()
            if recorder is not None and recorder.inputs is not None:
                inputs, recorder = recorder.inputs, None
                if self.journal and not self.journal.save_inputs(inputs):
                    self.notes.append("the recorded inputs are not all tensors, so they are not kept for --resume")
            return metric

        base = Baseline((sample(),))
        if recorder is not None:  # every sample came from the journal and the inputs were not kept
            base = Baseline(base.samples + (sample(),))
        return base, self._accept(base), inputs

    def _fp32_metric(self) -> float:
        trial = self.evaluator.baseline()
        if trial.metric is None:  # pragma: no cover - the evaluator raises for a failed baseline
            raise UserCodeError("evaluate gave no metric for the FP32 model")
        return trial.metric

    def _accept(self, base: Baseline) -> Acceptance:
        """The acceptance rule for `base`, reported (a BASELINE event, and a note when evaluate is noisy)."""
        noise = self.noise(base)
        accept = Acceptance(self.options.target(base.value), noise, self.options.lower_is_better)
        self._note_noise(base)
        self.emit(TuneEvent(EventKind.BASELINE, BaselineMeasured(base.value, noise, accept.target,
                                                                 self.options.lower_is_better)))
        return accept

    def noise(self, base: Baseline) -> float:
        """The margin a plan must clear the target by: the baseline's spread, and under --seeds the spread of
        the FP32 baseline's training runs (seeds), whichever is larger."""
        runs = [m for t in self.evaluator.trials if t.baseline for m in t.seeds if m is not None]
        return max(base.spread, max(runs) - min(runs) if runs else 0.0)

    def settle_noise(self, base: Baseline, accept: Acceptance, trials: SearchTrials,
                     first: Probe) -> tuple[Baseline, Acceptance, Probe]:
        """A one-run baseline made complete: settled when the all-low trial's signature matches the baseline's
        (the same data fed, nothing new drawn at random: tuner.search.repeatable), so a deterministic
        evaluate costs one FP32 run; else the baseline is evaluated again (more when noisy) and the all-low trial is
        judged again with the noise margin. Under torchrun only when every rank's signatures agree.
        `first`: the all-low trial's probe, as judged."""
        self.evaluator.signing = False  # the two signatures compared are in; later ones would not be read
        if base.complete:
            return base, accept, first
        runs = self.evaluator.trials
        fp32 = next(t for t in runs if t.baseline)
        low = next((t for t in runs if not t.baseline), None)
        same = low is not None and repeatable(fp32.signature, low.signature)
        if all(self.ranks.gather(same)):
            return dataclasses.replace(base, settled=True), accept, first
        base, accept = self.complete_baseline(base)
        return base, accept, trials.rejudge(base, accept, frozenset(), first)

    def complete_baseline(self, base: Baseline) -> tuple[Baseline, Acceptance]:
        """`base` evaluated again until complete (two equal runs, or NOISY_SAMPLES), and its acceptance.

        Two equal runs that fed other data or drew other numbers (their signatures differ: a metric seeded
        from os.urandom, a random subset) agree by luck as easily as by determinism, so those take one run
        more. The baseline's runs are signed for it (a hash of the data each feeds: only here, not in the
        search's trials)."""
        self.evaluator.signing = True  # the first two runs' signatures are compared below
        try:
            base = measure_baseline(self._fp32_metric, base.samples)
            if not base.noisy and not self._fp32_runs_repeat():
                base = measure_baseline(self._fp32_metric, base.samples + (self._fp32_metric(),))
        finally:
            self.evaluator.signing = False
        return base, self._accept(base)

    def _fp32_runs_repeat(self) -> bool:
        """Whether the first two FP32 baseline runs fed the same data and drew alike (tuner.search.repeatable),
        on every rank. Runs of one process are compared: where the first came from the journal of an
        interrupted run and this one made the all-low trial and the second (a resumed run whose all-low trial was
        cut off), those two are, since what evaluate builds on its first call in a process (data drawn and kept)
        is not in the journal, and its first run here differs from the journal's for that alone."""
        trials = self.evaluator.trials
        fp32 = [t for t in trials if t.baseline][:2]
        low = next((t for t in trials if not t.baseline), None)
        same = len(fp32) == 2 and repeatable(fp32[0].signature, fp32[1].signature)
        if not same and len(fp32) == 2 and fp32[0].from_journal and not fp32[1].from_journal \
                and low is not None and not low.from_journal:
            same = repeatable(low.signature, fp32[1].signature)
        return all(self.ranks.gather(same))

    def _unconfirmable(self, base: Baseline) -> bool:
        """The metric's noise is as large as the tolerance allows: no trial can clear the target by more than
        the noise, so the search ends with the baseline (the all-FP32 plan), warned by `_note_noise`."""
        noise = self.noise(base)
        return noise > 0 and noise >= self.options.slack(base.value)

    def _note_noise(self, base: Baseline) -> None:
        noise = self.noise(base)
        if noise > 0 and noise > base.spread:
            self.notes.append(f"the FP32 baseline's {self.options.seeds} training runs (--seeds) spread over "
                              f"{noise:.3g}; a plan's mean must clear the target by more than that")
        elif base.noisy:
            self.notes.append(f"evaluate is not deterministic: {len(base.samples)} FP32 runs spread over "
                              f"{base.spread:.3g}; a plan must clear the target by more than that")
        else:
            return
        if self._unconfirmable(base):
            remedy = ("train longer or score on more data so the seeds agree" if noise > base.spread else
                      "make evaluate deterministic (fixed seeds, no dropout)")
            self.warnings.append(f"the metric's noise ({noise:.3g}) is as large as the tolerance allows "
                                 f"({self.options.slack(base.value):.3g}): no plan can be confirmed, so the "
                                 f"search stops here; {remedy} or raise the tolerance")

    def example_inputs(self, recorded: ModelInputs | None) -> ModelInputs:
        """The inputs of the recorded forwards, on the tune's device: example_inputs() when the user gave it,
        else the inputs recorded (or kept) by the baseline."""
        source = self.inputs_source
        inputs: Any
        if callable(source):
            t0 = time.monotonic()
            try:
                inputs = source()
            finally:
                self.keeper.guard.restore("example_inputs()")
            self.user_seconds += time.monotonic() - t0
        elif source is not None:
            inputs = source
        elif recorded is not None:
            inputs = recorded
        else:
            raise ConfigError("there is no example_inputs() and evaluate never called the model; "
                              "cannot find the op instances to tune")
        found = ModelInputs.of(inputs)
        meta = [t for t in tensor_leaves((found.args, dict(found.kwargs))) if t.is_meta]
        if meta:
            raise UserCodeError(f"example_inputs() returned {len(meta)} tensor(s) on the meta device (first: shape "
                                f"{tuple(meta[0].shape)}): they hold no data to run the model on; return real "
                                "tensors")
        return found.to(self.keeper.device)

    def find_candidates(self, inputs: ModelInputs) -> Candidates:
        """The op instances to decide about (tuner.search.candidates), after the modules that must stay FP32
        (none when the evaluator's first look ran the all-low plan: else a probe finds them)."""
        fixes = AutocastFixes()
        all_low = plan_for(self.options, None, ())
        if not self.evaluator.first_look(all_low, inputs):  # else it ran as it is
            with self.keeper.borrowed() as model:
                fixes = autocast_fixes(model, inputs, all_low)
        for path, why in fixes.modules.items():
            self.notes.append(f"module {path or '(root)'} stays FP32: torch.autocast cannot run it in "
                              f"{self.options.dtype} on this machine ({why})")
        if fixes.root_calls:
            calls = ", ".join(c.label() for c in fixes.root_calls)
            self.notes.append(f"the model's own ops (its forward outside any submodule) stay FP32, its submodules "
                              f"keep the plan: torch.autocast cannot run {calls} in {self.options.dtype} on this "
                              f"machine ({fixes.root_reason})")
        known = self.fp32_output(inputs) if self.fp32_output is not None else None
        with self.keeper.borrowed(light=True) as model:  # what it finds steers; the all-low trial compares first
            found = find_candidates(model, inputs, self.policy, self.dtype, fixes.modules, fixes.root_calls,
                                    ref_out=FORWARD if known is None else known)
        self.evaluator.kept = frozenset(found.fp32_calls)
        self.emit(TuneEvent(EventKind.CANDIDATES, CandidatesFound(len(found), self.options.dtype,
                                                                  str(self.options.preset), found.all_low_error)))
        return found

    def all_low(self, found: Candidates, trials: SearchTrials) -> tuple[Probe, LowForward | None]:
        """The all-low trial, unless its output on the example inputs overflows (inf or NaN): that plan fails
        without an evaluation, and the search starts from the units that overflow (they rank first). Also
        the forward that told (its output error and seconds: the guide's first point), None under torchrun,
        where the trial is always evaluated (a forward would have to run on every rank together)."""
        if not found.instances or self.ranks.distributed:
            return trials.probe(frozenset(), {}), None
        plan = plan_for(self.options, found, ())
        error = self.evaluator.output_error(plan, found.ref_out)
        low = (error, self.evaluator.forward_s)
        if error == math.inf:
            self.notes.append(f"with everything eligible in {self.options.dtype} the output overflows on the "
                              "example inputs (inf or NaN); that plan was not evaluated")
            return Probe(False, math.inf), low
        self.evaluator.watch = plan  # written whenever it passes: its evaluation's first forward is the report's
        try:
            return trials.probe(frozenset(), {}), low
        finally:
            self.evaluator.watch = None

    def range_recorder(self, found: Candidates, low: LowForward | None) -> RangeRecorder | None:
        """The range rule's recorder when the rule runs: under fp16, or any dtype whose all-low output overflowed;
        not under torchrun (every rank would have to run each forward). The gradient ranking's first pass
        feeds it (every candidate FP32: the forward the rule needs), else `range_rule` runs one forward."""
        overflowed = low is not None and low[0] == math.inf
        if self.ranks.distributed or not (self.dtype == torch.float16 or overflowed):
            return None
        return RangeRecorder(found.instances)

    def range_rule(self, found: Candidates, low: LowForward | None,
                   recorder: RangeRecorder | None) -> LowForward | None:
        """The candidates whose values leave the lower dtype's range start FP32 (`tuner.measure.ranges`), from the
        FP32 magnitudes `recorder` saw; where the all-low output overflowed, forwards follow the chain until one
        is finite. No evaluation. Returns the guide's first point: the forward of the plan with those FP32
        (`low` when the rule kept nothing or does not run)."""
        if recorder is None:
            return low
        overflowed = low is not None and low[0] == math.inf
        wider = self._wider_fallback()
        with self.keeper.borrowed(light=True) as model:
            ranges = recorder.ranges() if recorder.ran else \
                record_ranges(model, found.inputs, self.policy, self.dtype, found.instances, found.fp32_calls,
                              found.fp32_modules)
            kept = beyond_range(ranges.magnitudes, self.dtype, self.options.dtype)
            if overflowed:
                kept, _ = follow_chains(model, found.inputs, self.policy, self.dtype, list(found.instances), kept,
                                        self.options.dtype, always=found.fp32_calls, modules=found.fp32_modules,
                                        skip=ranges.nonfinite, fallback_dtype=wider if wider is not None else _F32)
        if not kept:
            return low
        other = self._fits_fallback(kept)
        # a kept op whose inputs are FP32 under the rule's plan runs FP32 with no override (a pass-through op
        # after a kept producer): dropped, or its module would become an FP32 island for nothing (`search`)
        idle = self._record(found, tuple(sorted(kept)), other).idle
        kept = {c: why for c, why in kept.items() if c not in idle} or kept
        self.range_kept = kept
        self.range_fallback = other
        error = self.evaluator.output_error(plan_for(self.options, found, kept, other), found.ref_out)
        sent = f"in {self.options.fallback} (the fallback dtype)" if other else "FP32"
        self.notes.append(f"the range rule kept {len(kept)} op instance(s) {sent} before any evaluation: their "
                          f"values on the example inputs leave {self.options.dtype}'s range (report.md says which)")
        return error, self.evaluator.forward_s

    def _wider_fallback(self) -> torch.dtype | None:
        """The fallback dtype when its range is wider than the lower dtype's (bf16 after fp16): where the range
        rule sends what leaves the lower dtype's range; None without a fallback chain, or one as narrow."""
        wider = self.fallback is not None and torch.finfo(self.fallback).max > torch.finfo(self.dtype).max
        return self.fallback if wider else None

    def _fits_fallback(self, kept: Mapping[OpInstance, RangeReason]) -> frozenset[OpInstance]:
        """What the range rule kept whose values the fallback dtype's range holds (a chain's overflow included:
        it comes from the lower dtype's range): those run in the fallback dtype, the rest FP32."""
        wider = self._wider_fallback()
        if wider is None:
            return frozenset()
        limit = float(torch.finfo(wider).max)
        return frozenset(c for c, why in kept.items() if why.side is RangeSide.CHAIN or why.reached <= limit)

    def check_metric_sees_outputs(self, found: Candidates, base: Baseline) -> None:
        """UserCodeError when running every candidate low changes the model's output a lot (relative error
        UNSEEN_OUTPUT_ERROR or more on the inputs) and evaluate's metric not at all: evaluate does not measure
        the model mpt tunes (a graph traced or compiled earlier, another method), so every plan would pass."""
        low = next((t for t in reversed(self.evaluator.trials) if not t.baseline and not t.fp32), None)
        error = found.all_low_error
        if low is None or low.metric is None or not error >= UNSEEN_OUTPUT_ERROR or base.noisy \
                or low.metric != base.value:
            return
        raise UserCodeError(
            f"with every candidate in {self.options.dtype} the model's output on the example inputs changes by "
            f"{error:.2e} (relative error), yet evaluate's metric did not change at all ({low.metric:g}): evaluate "
            "does not measure what the model's forward computes. It may run a graph traced or compiled earlier "
            "(torch.jit.trace/script, torch.compile), another method (model.encode), or compute its metric from "
            "something else than the outputs; make evaluate compute its metric from model(...)",
            where=user_site(self.evaluator.evaluate_fn))

    def aid_limits(self, found: Candidates, low: LowForward | None) -> AidLimits:
        """What the ranking and the guide may spend (`tuner.search.budget`), rank 0's on every rank (the
        ranking's passes are collective on a sharded model)."""
        forwards = self._evaluate_forwards(found, 0.0 if low is None else low[1])
        return self.ranks.broadcast(aid_limits(sum(found.flops.values()), forwards))

    def rank(self, found: Candidates, probes: int = MAX_PROBES,
             observer: RangeRecorder | None = None) -> dict[OpInstance, float]:
        """Score every candidate by the error it adds to the output, from cheap passes on the example inputs
        (`probes`: the gradient ranking's backward passes; `observer` sees its first pass: the range rule's)."""
        method = RankMethod(self.options.rank)

        def progress(done: int, total: int) -> None:
            self.emit(TuneEvent(EventKind.RANK, RankProgress(method, done, total)))

        self.ranks.same([c.label() for c in found.instances], "op instances to tune")
        with self.keeper.borrowed(light=True) as model, compact_heap():  # (tuner.core.heap: its graph fragments)
            if method is RankMethod.GRADIENT:
                scores = rank_gradient(model, found.inputs, self.policy, self.dtype, list(found.instances),
                                       found.ref_out, progress, probes=probes, observer=observer)
            else:
                scores = rank_exact(model, found.inputs, self.policy, self.dtype, list(found.instances),
                                    found.ref_out, progress, raised=lambda _, exc: self.evaluator.note_raised(exc))
            if Sharding.of(model).sharded:  # each rank scored through its shards: the mean over the ranks
                return self.ranks.mean(scores)
            return self.ranks.broadcast(scores)  # every rank searches in rank 0's order

    def search(self, found: Candidates, scores: Scores, trials: SearchTrials, first: Probe,
               low: LowForward | None, limits: AidLimits = FULL
               ) -> tuple[frozenset[OpInstance] | None, StopReason | None]:
        """PrecisionSearch over units (every candidate one module's own code calls: what a loaded plan can run
        in FP32 without Python per op, `tuner.engine.native`; with `granularity: type`, every candidate of one op
        type); its chosen FP32 set and why it stopped early. What the range rule kept is FP32 in every plan
        tried, and its plan (the rest low) is the first trial."""
        every = found.type_units() if self.options.granularity == Granularity.TYPE.value else found.units()
        # a unit is what a loaded plan can run FP32 (`tuner.engine.native`; a type for the op lists): what the
        # range rule kept takes its whole unit, or the plan tried would claim one call FP32 beside a sibling its
        # module runs FP32 too
        kept = {i for i, c in enumerate(found.instances) if c in self.range_kept}
        fixed = frozenset(i for unit in every if kept.intersection(unit) for i in unit)
        units = [unit for unit in every if not fixed.intersection(unit)]
        # a fallback chain: the units of what the range rule sent to the fallback dtype run there, whole
        fp32_kept = {i for i in kept if found.instances[i] not in self.range_fallback}
        trials.fallback = found.pick(frozenset(i for unit in every if kept.intersection(unit)
                                               and not fp32_kept.intersection(unit) for i in unit))
        outcome, search = self._search(found, scores, trials, first, low, limits, fixed, units)
        if outcome.fp32 is None and trials.fallback and outcome.stopped is None:  # FP32 last, as in no chain
            self.notes.append(f"the range rule's plan failed with its {len(trials.fallback)} instance(s) in "
                              f"{self.options.fallback} even with everything else FP32: searched again with them "
                              "FP32")
            trials.fallback = frozenset()
            outcome, search = self._search(found, scores, trials, first, None, limits, fixed, units)
        if fixed and outcome.fp32 is not None and not outcome.fp32:
            rest = f"{self.options.fallback} or FP32" if trials.fallback else "FP32"
            self.notes.append(f"the range rule's plan passes ({len(fixed)} instance(s) in {rest}): everything "
                              f"else runs in {self.options.dtype}")
        self.notes.extend(n for n in outcome.notes if not (fixed and n.startswith("everything eligible")))
        if self.evaluator.raised:  # a mixed plan the model's own code cannot run: failing, not the end of the tune
            self.notes.append(f"{len(self.evaluator.raised)} call(s) in the model raised under a mixed plan on "
                              "the example inputs; those plans counted as failing: " + "; ".join(self.evaluator.raised))
        if search.guide is not None and search.guide.forwards:
            self.notes.append(f"{search.guide.forwards} forwards on the example inputs guided the search "
                              f"({search.guide.seconds:.1f} s)")
        if outcome.fp32 is None:
            return None, outcome.stopped  # type: ignore[return-value]
        stopped = outcome.stopped
        if self.fallback is not None and stopped is None:
            stopped = self.chain(found, units, outcome.fp32, trials, fixed)
        chosen = found.pick(fixed | {i for n in outcome.fp32 for i in units[n]})
        self.chosen_fallback = chosen & trials.fallback
        return chosen, stopped  # type: ignore[return-value]

    def _search(self, found: Candidates, scores: Scores, trials: SearchTrials, first: Probe,
                low: LowForward | None, limits: AidLimits, fixed: frozenset[int],
                units: list[tuple[int, ...]]) -> tuple[SearchOutcome, PrecisionSearch]:
        """One PrecisionSearch over `units`, `fixed` kept out of the lower dtype in every plan it tries."""
        spare = 2 - min(2, len(trials.base.samples))  # evaluations a settled one-run baseline left unspent
        search = PrecisionSearch([math.sqrt(sum(scores[found.instances[i]] ** 2 for i in u)) for u in units],
                                 lambda picked: trials.probe(fixed | {i for n in picked for i in units[n]}, scores),
                                 costs=[sum(found.costs[found.instances[i]] for i in u) for u in units],
                                 thorough=self.options.thorough, all_low_failed=not fixed,
                                 all_low_drop=None if fixed else first.drop,
                                 guide=self.guide(found, units, low, limits, fixed, trials.fallback),
                                 extra_probes=1 + spare)
        return search.run(), search

    def chain(self, found: Candidates, units: list[tuple[int, ...]], picked: frozenset[int], trials: SearchTrials,
              fixed: frozenset[int]) -> StopReason | None:
        """A fallback chain's second link: the units the search kept FP32 tried in the fallback dtype, all of
        them in one trial, then (when that fails and there are two or more) the costlier half; the first that
        passes joins `trials.fallback`. At most CHAIN_TRIALS evaluations past the search's, said in a note.
        Returns why a bound cut it short (the search's plan stands); an interrupt ends the tune."""
        out = sorted(picked, key=lambda n: -sum(found.costs[found.instances[i]] for i in units[n]))
        groups = [out, out[:len(out) // 2]][:CHAIN_TRIALS if len(out) > 1 else 1] if out else []
        keep = fixed | {i for n in picked for i in units[n]}
        spent, before = 0, trials.fallback
        for group in groups:
            trials.fallback = before | found.pick(frozenset(i for n in group for i in units[n]))
            try:
                spent += 1
                passed = trials.probe(keep, {}).passed
            except SearchStopped as stop:
                trials.fallback = before
                if stop.reason is StopReason.INTERRUPTED:
                    raise
                self.notes.append(f"fallback chain: the search's FP32 units were not tried in "
                                  f"{self.options.fallback} (a bound was reached)")
                return stop.reason  # type: ignore[return-value]
            if passed:
                self.notes.append(f"fallback chain: {len(group)} of the search's {len(out)} FP32 unit(s) run in "
                                  f"{self.options.fallback} instead ({spent} evaluation(s) past the search's)")
                return None
            trials.fallback = before
        if groups:
            self.notes.append(f"fallback chain: the search's {len(out)} FP32 unit(s) failed in "
                              f"{self.options.fallback} too ({spent} evaluation(s) past the search's); they stay "
                              "FP32")
        return None

    def guide(self, found: Candidates, units: list[tuple[int, ...]], low: LowForward | None,
              limits: AidLimits = FULL, fixed: frozenset[int] = frozenset(),
              fallback: frozenset[OpInstance] = frozenset()) -> Guide | None:
        """The search's guide: a unit set kept FP32 -> the output error of its plan on the example inputs
        (Evaluator.output_error), as many forwards as `limits` allow (`aid_limits`). None under
        torchrun (every rank would have to run each forward together) or when the output has no
        floating-point tensor to compare. `low`: the forward of the plan with no unit FP32 (all low but `fixed`,
        the range rule's: TuneSession.all_low, range_rule)."""
        if self.ranks.distributed or low is None:
            return None
        low_error = low[0]
        if low_error is None:
            return None

        def error(picked: frozenset[int]) -> float:
            fp32 = found.pick(fixed | {i for n in picked for i in units[n]})
            value = self.evaluator.output_error(plan_for(self.options, found, fp32, fallback & fp32), found.ref_out)
            return math.inf if value is None else value

        return Guide(error, max_prefixes=limits.prefixes, max_units=limits.units, known={frozenset(): low_error},
                     max_forwards=limits.forwards)

    def _evaluate_forwards(self, found: Candidates, forward_s: float) -> float:
        """How many forwards of the example inputs one evaluate is worth: the tensor elements the evaluations
        fed the model's forward over the example inputs' (counts, alike in every run of the same command);
        seconds where those are not known (a journal written before mpt counted them)."""
        fed = [t.fed for t in self.evaluator.trials if t.fed]
        example = found.inputs.elements()
        if fed and example:
            return statistics.fmean(fed) / example
        seconds = [t.seconds for t in self.evaluator.trials]
        return statistics.fmean(seconds) / forward_s if seconds and forward_s > 0 else math.inf

    # --- the answer ------------------------------------------------------------------------------------------
    def final_fp32(self, found: Candidates | None, chosen: frozenset[OpInstance] | None,
                   stopped: StopReason | None) -> tuple[tuple[OpInstance, ...], float | None, int | None,
                                                        tuple[OpInstance, ...]]:
        """The FP32 instances of the plan to write, the metric that confirmed it and its trial number: the
        best confirmed trial's set less the overrides that change nothing; all candidates when none passed.
        That trial's label then counts what its plan records (`3 FP32 (4 tried, 1 change nothing)`): a
        recorded forward, spent on this trial alone."""
        best = best_trial(self.evaluator.trials, chosen, self.chosen_fallback)
        if best is None or found is None:
            return tuple(sorted(found.instances if found else ())), None, None, ()
        fp32, other = found.by_label(best.fp32), found.by_label(best.fallback)
        if stopped is StopReason.INTERRUPTED:
            return fp32, best.metric, best.n, other
        plan = plan_for(self.options, found, fp32, frozenset(other))
        reused = found.all_low_record if plan == plan_for(self.options, found, ()) else None
        if reused is not None and (self.options.for_training or not self.evaluator.needs_forward(plan)):
            # the all-low plan: the candidates phase recorded it and `first_look` observed it; no forward
            # here, so no loan and no pass over the weights after one
            self.recorded = reused
            if not self.options.for_training:
                self.lowered = self.evaluator.confirm_lowered(self.keeper.modules, plan)
        else:
            fp32, other = self._record_written(found, plan, fp32, other, reused)
        self._relabel(best, len(fp32))
        return fp32, best.metric, best.n, other

    def _record_written(self, found: Candidates, plan: Plan, fp32: tuple[OpInstance, ...],
                        other: tuple[OpInstance, ...], reused: PlanRecord | None
                        ) -> tuple[tuple[OpInstance, ...], tuple[OpInstance, ...]]:
        """The written plan's recorded forward (`reused` when the candidates phase made it) and the proof of
        its lowered weights, in one loan; its FP32 and fallback instances less the overrides that change
        nothing."""
        with self.keeper.borrowed() as model:  # one loan, so one pass over the weights after it, not two
            self.recorded = reused or record_plan(model, plan, found.inputs)
            idle = self.recorded.idle - set(found.fp32_calls)  # those make FP32 islands: not theirs to drop
            if idle:
                fp32 = tuple(i for i in fp32 if i not in idle)
                other = tuple(i for i in other if i not in idle)
                self.notes.append(f"{len(idle)} FP32 override(s) dropped: their inputs are FP32 under the plan, so "
                                  "they ran in FP32 anyway" if self.fallback is None else f"{len(idle)} override(s) "
                                  "dropped: their inputs come in the dtype they name under the plan, so they ran in "
                                  "it anyway")
            if not self.options.for_training:  # the trials' predicted weight dtypes, proven on this plan
                self.lowered = self.evaluator.confirm_lowered(model, plan_for(self.options, found, fp32, other))
        return fp32, other

    def _relabel(self, trial: Trial, kept: int) -> None:
        """`trial`'s label and `kept` with the FP32 instances its plan records counted."""
        trials = self.evaluator.trials
        at = next(i for i, t in enumerate(trials) if t is trial)
        before = next((t.fp32 for t in reversed(trials[:at]) if not t.baseline), None)
        label = Change.between(before, trial.fp32, kept).text(self.options.dtype)
        if trial.fallback:
            label += f"; {len(trial.fallback)} in {self.options.fallback}"
        trials[at] = dataclasses.replace(trial, label=label, kept=kept)

    def _record(self, found: Candidates, fp32: tuple[OpInstance, ...],
                fallback: frozenset[OpInstance] = frozenset()) -> PlanRecord:
        """The recorded forward of the chosen trial's plan: its overrides that change nothing, and (they
        change no op's dtype) the shares and claims of the plan written, which the report reuses."""
        with self.keeper.borrowed() as model:
            return record_plan(model, plan_for(self.options, found, fp32, fallback), found.inputs)

    def seed_notes(self, accept: Acceptance, chosen: int | None) -> list[str]:
        """Under --seeds: a note for each trial whose verdict depends on the seed (some training runs reach the
        target, others do not), the chosen plan's first: another seed could have decided otherwise."""
        notes = []
        first = next((t for t in self.evaluator.trials if t.baseline and len(set(t.seeds)) == 1), None)
        if first is not None and len(first.seeds) > 1:
            notes.append(f"the FP32 baseline's {len(first.seeds)} training runs (--seeds) gave one metric: evaluate "
                         "seeds its own generators (or draws nothing at random), so every seed trains alike")
        for trial in self.evaluator.trials:
            split = None if trial.baseline else _seed_verdicts(trial, accept)
            if split is not None:
                which = "the chosen plan" if trial.n == chosen else f"trial {trial.n} ({trial.label})"
                notes.append(f"{which}'s verdict depends on the seed: {split}, judged "
                             f"{'passed' if trial.passed else 'failed'} on the mean")
        return sorted(notes, key=lambda n: not n.startswith("the chosen plan"))

    def shown_scores(self, found: Candidates | None, scores: Scores, fp32: tuple[OpInstance, ...],
                     stopped: StopReason | None) -> tuple[dict[str, float], frozenset[str]]:
        """The scores the report shows, by label, and those that stay first-order estimates. The plan's FP32
        candidates get their output error measured alone (`rank_exact`: that op alone low, its inputs as it
        receives them with the rest FP32; one forward each, at most the guide's units per round, the least
        estimated first: the gradient ranking charges an input's rounding to its producer, so a consumer's
        estimate can sit far below what it does alone). An op that overflows alone shows inf. Not under
        torchrun (a forward of a sharded model needs every rank) nor after an interrupt: estimates, marked."""
        shown = {c.label(): v for c, v in scores.items()}
        if found is None or not scores or stopped is StopReason.INTERRUPTED or self.ranks.distributed:
            return shown, frozenset(c.label() for c, v in scores.items() if math.isfinite(v))
        finite = sorted((c for c in fp32 if c in scores and math.isfinite(scores[c])), key=lambda c: scores[c])
        todo = finite[:self.limits.units]
        if todo:
            with self.keeper.borrowed(light=True) as model:
                measured = rank_exact(model, found.inputs, self.policy, self.dtype, list(found.instances),
                                      found.ref_out, only=todo)
            shown.update({c.label(): v for c, v in measured.items()})
        return shown, frozenset(c.label() for c in scores if c not in todo and math.isfinite(scores[c]))

    def result(self, base: Baseline, accept: Acceptance, inputs: ModelInputs | None, found: Candidates | None,
               scores: Scores, chosen: frozenset[OpInstance] | None, stopped: StopReason | None) -> TuneResult:
        fp32, metric, chosen_n, other = self.final_fp32(found, chosen, stopped)
        status = TuneStatus.MET if chosen_n is not None else TuneStatus.NOT_MET
        opts, ev = self.options, self.evaluator
        # the calls every plan keeps FP32 count as op instances in FP32 ("2 of 2"), though no trial chose them
        candidates = list(found.instances) + list(found.fp32_calls) if found else []
        lowered: dict[str, Any] | None = {} if opts.for_training else self.lowered  # training: FP32 weights ran
        plan = plan_for(opts, found, fp32, other,
                        metrics={"baseline": base.value, "tuned": metric, "target": accept.target,
                                 "tolerance": opts.tolerance, "absolute": opts.absolute,
                                 "lower_is_better": opts.lower_is_better, "noise": self.noise(base),
                                 "evaluations": ev.evals, "candidates": len(candidates),
                                 "status": status.value, "stopped": stopped.value if stopped else None})
        shown, estimated = self.shown_scores(found, scores, fp32, stopped)
        deployed = self.evaluator.deployed_seen(plan_for(opts, found, fp32, other), lowered)
        notes, warnings = list(self.notes), [*ev.warnings, *self.warnings]
        coarse = coarse_metric_note([t.metric for t in ev.trials if t.metric is not None],
                                    abs(base.value - accept.target), _known_step(ev.evaluate_fn),
                                    training=opts.for_training)
        if coarse and found is not None and found.instances and self.noise(base) == 0:
            notes.append(coarse)
        for note in self.seed_notes(accept, chosen_n):  # the chosen plan's in report.md's warnings
            (warnings if note.startswith("the chosen plan") else notes).append(note)
        leaked = self.keeper.guard.warning()
        if leaked:
            warnings.append(leaked)
        if stopped is not None:
            notes.append(f"search cut short: {stopped.describe(opts)}; the best plan confirmed so far was kept")
        return TuneResult(plan=plan, status=status, baseline=base.value, target=accept.target, metric=metric,
                          trials=ev.trials, evals=ev.evals, stopped=stopped, candidates=candidates,
                          scores=shown, notes=notes, estimated=estimated,
                          range_kept={c.label(): r.text() for c, r in self.range_kept.items()},
                          flop_shares=found.flop_shares() if found else {},
                          seconds=time.monotonic() - self.started, eval_seconds=ev.eval_seconds,
                          user_seconds=self.user_seconds, inputs=inputs, warnings=warnings,
                          noise=self.noise(base), rebuilds=self.keeper.rebuilds, chosen=chosen_n, lowered=lowered,
                          recorded=self.recorded, phases=self.clock, deployed=deployed)


def _seed_verdicts(trial: Trial, accept: Acceptance) -> str | None:
    """`trial`'s verdict per training run (--seeds) when it depends on the seed: which seeds pass the target
    alone and which do not; None when they all agree."""
    alone = dataclasses.replace(accept, margin=0.0)
    passing = [k for k, m in enumerate(trial.seeds) if alone.confirms(m)]
    if not passing or len(passing) == len(trial.seeds):
        return None
    failing = [k for k in range(len(trial.seeds)) if k not in passing]
    shown = ", ".join(f"{m:.4g}" if m is not None else "failed" for m in trial.seeds)
    return (f"seed(s) {', '.join(map(str, passing))} pass and seed(s) {', '.join(map(str, failing))} fail "
            f"(metrics {shown}; mean {'failed' if trial.metric is None else f'{trial.metric:.4g}'})")


def _known_step(evaluate: Callable[[nn.Module], Any]) -> float | None:
    """The step a built-in metric says it moves in (`FidelityEvaluate.metric_step`), reached through the
    bound `UserModel.evaluate` the CLI hands over; None for the user's own evaluate."""
    owner = getattr(evaluate, "__self__", None)
    for fn in (evaluate, getattr(owner, "eval_fn", None)):
        step = getattr(fn, "metric_step", None)
        if isinstance(step, float):
            return step
    return None


def tune(build: Callable[[], nn.Module] | nn.Module, evaluate: Callable[[nn.Module], Any] | None = None,
         example_inputs: Callable[[], Any] | Any = None, options: TuneOptions | None = None, *,
         journal: Journal | None = None, on_event: Callable[[TuneEvent], None] | None = None,
         started: float | None = None, **option_values: Any) -> TuneResult:
    """Find the op instances that must stay FP32 for `evaluate(model)` to stay within tolerance.

    `build` is a function that builds the FP32 model (or the model itself, which
    then costs one extra copy: every trial starts from a fresh deep copy when
    evaluate changed it); `evaluate(model)` returns the metric (a number or a
    one-element tensor). A trial whose metric is NaN/inf or whose evaluate
    raises fails and the search moves on; the baseline raising propagates.
    The search's options are TuneOptions' fields, as keywords
    (`tune(build, evaluate, dtype="bf16", tolerance=0.005)`) or as `options=TuneOptions(...)`, not both.
    `started` (time.monotonic()) is when the time budget starts; default now.
    Like INC's `autotune(model, config, eval_fn)`. Without `evaluate`, `metric=` (agreement, cosine, kl,
    rel-error) compares the outputs with the FP32 model's on `data=` (a file) or on `example_inputs` (a list
    of batches, or one batch), or (perplexity, loss) scores a language model's next tokens on them; a given
    `evaluate` wins unless `metric=` is named.
    """
    options = tune_options(options, option_values)
    if isinstance(build, nn.Module):
        template = build
        build = lambda: copy.deepcopy(template)  # noqa: E731
    if options.metric is not None:
        evaluate, example_inputs = builtin_evaluate(build, example_inputs, options)
    elif evaluate is None:
        raise TypeError("tune(): give evaluate, or metric= (agreement, cosine, kl, rel-error, perplexity, loss) "
                        "with data= or example_inputs")
    session = TuneSession(build, evaluate, example_inputs, options, journal=journal,
                          on_event=on_event, started=time.monotonic() if started is None else started,
                          fp32_output=first_output_of(evaluate))
    return session.run()


def tune_options(options: TuneOptions | None, values: Mapping[str, Any]) -> TuneOptions:
    """`tune()`'s options: `options`, or a TuneOptions made from its keyword options (TypeError for both, for a
    keyword that is no option, or for `options` that is not a TuneOptions)."""
    if options is not None and not isinstance(options, TuneOptions):
        raise TypeError(f"tune(): options must be a TuneOptions, found {type(options).__name__}; or give the "
                        "options as keywords: tune(build, evaluate, tolerance=0.01)")
    if not values:
        return options or TuneOptions()
    if options is not None:
        raise TypeError(f"tune(): give options=TuneOptions(...) or keyword options ({', '.join(values)}), not both")
    names = [f.name for f in dataclasses.fields(TuneOptions)]
    unknown = [k for k in values if k not in names]
    if unknown:
        raise TypeError(f"tune() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; its options: "
                        f"{', '.join(names)}")
    return TuneOptions(**values)

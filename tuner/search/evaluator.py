"""Full evaluations: the one place a tune calls the user's `evaluate`.

An `Evaluator` reads a trial from the journal when an earlier run made it, else checks the bounds (evaluations,
time from the start of the command), builds the trial's model as `tuner.load` builds it from the trial's plan
(the plan attached as `tuner.load` attaches it, and the parameters the checkpoint would store lowered held
lowered by the keeper: `tuner.measure.held`), so the plan the search approves is the model that is deployed, runs
`evaluate` on the model the keeper lends, writes the journal, counts, and reports the trial. An `evaluate`
that returns without calling the model (`model(...)`: a cached traced graph, another method) measures nothing
mpt changes and is refused (UserCodeError); torch's global state is put back after each one
(tuner.core.torch_state). An evaluation that runs out of memory is retried once and never journaled as a
failed trial (it raises OutOfMemory the second time). Under torchrun rank 0's bounds decide and every rank
must get the same metric (tuner.search.distributed).
"""
from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import nn

from tuner.core.errors import OutOfMemory, UserCodeError, exc_line
from tuner.core.inputs import ModelInputs, detached_copy, element_count, same_inputs
from tuner.core.loader import call_forward, raised_at, user_site
from tuner.core.memory import find_out_of_memory, free_memory, out_of_memory
from tuner.core.sharding import Sharding
from tuner.engine.attach import attach, detach
from tuner.engine.scaler import LossScaler, ScalerSummary, watching
from tuner.measure.deployed import FirstCall, NotAsClaimed, Observation, observe, weight_dtypes
from tuner.measure.inspection import relative_error
from tuner.measure.lowering import ParameterUses, parameter_uses, predictable, predicted_lowered, uses_of
from tuner.measure.shares import Shares
from tuner.policy.plan import OpInstance, Plan
from tuner.search.distributed import Ranks, SharedJournal
from tuner.search.misuse import BaselineWatch, trained_warnings
from tuner.search.noise import Acceptance
from tuner.search.repeatable import Draws, RunSignature, generator_states, restore_generators, seed_generators
from tuner.search.results import Evaluating, EventKind, StopReason, Trial, TuneEvent
from tuner.search.strategy import SearchStopped
from tuner.workspace.journal import Journal
from tuner.workspace.keeper import ModelKeeper

BASELINE_KEY = "baseline#{n}"
SEED_KEY = "@seed{k}"  # after a trial's key: its training run k > 0 (`--seeds`)

def trial_key(fp32_labels: tuple[str, ...], fallback: tuple[str, ...] = ()) -> str:
    """The journal key of the trial that keeps these instances (sorted labels) FP32 and runs `fallback` in the
    fallback dtype (absent without: journals from before fallback chains still resume)."""
    return "fp32=" + ",".join(fp32_labels) + (";fallback=" + ",".join(fallback) if fallback else "")


def _to_float(value: Any) -> float:
    if isinstance(value, torch.Tensor):
        return float(value.detach().cpu().item())
    return float(value)


NO_FORWARD = ("evaluate returned a metric without calling the model ({which}): mpt tunes what the model's "
              "forward runs, so a metric that never runs it cannot tell plans apart and the search would approve "
              "any of them. Call the model itself in evaluate (`model(x)`), and do not reuse a graph traced or "
              "compiled from an earlier model (torch.jit.trace/script, torch.compile, torch.export) or another "
              "method (model.encode) that bypasses forward")


class _ForwardCount:
    """Counts the calls of `model(...)` (and of deep copies of it) while it lives, and the tensor elements
    they were given (`fed`: how much forward work an evaluate is, in a number a rerun gives again), and
    passes them to `signature` (tuner.search.repeatable): a forward pre-hook."""

    def __init__(self, model: nn.Module, signature: RunSignature | None = None,
                 watch: BaselineWatch | None = None) -> None:
        self.calls = 0
        self.fed = 0

        def count(module: nn.Module, args: Any, kwargs: Any) -> None:  # a function: deepcopy shares it
            self.calls += 1
            self.fed += element_count((args, kwargs))
            if signature is not None:
                signature.feed(args, kwargs)
            if watch is not None:
                watch(module)

        self._handle = model.register_forward_pre_hook(count, with_kwargs=True)

    def remove(self) -> None:
        self._handle.remove()


class _Run(NamedTuple):
    """What one evaluate gave: its metric (None: failed, `error` says why), its seconds, the tensor elements
    it fed the model's forward, its signature (tuner.search.repeatable; None: not readable) and the states
    of the generators it moved (Draws.moved: the journal keeps them for --resume)."""

    metric: float | None
    error: str | None
    seconds: float
    fed: int
    signature: str | None
    moved: dict[str, Any]
    scaler: ScalerSummary | None = None  # what the tuner.LossScalers it made did


def _describe(exc: Exception) -> str:
    """A failed trial's error, on one line, with the call that raised (`file.py:LINE`, the model's code: a
    mixed plan can make the model's own code raise, e.g. a dtype read from one tensor applied to another)."""
    if isinstance(exc, UserCodeError):
        return str(exc)
    where = raised_at(exc)
    return (f"evaluate raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            + (f" ({where})" if where else ""))


def _combined(runs: list[_Run]) -> tuple[float | None, str | None]:
    """A trial's metric and error from its training runs (`--seeds`): the mean, or the first run's failure."""
    if len(runs) == 1:
        return runs[0].metric, runs[0].error
    for k, run in enumerate(runs):
        if run.metric is None:
            return None, f"training run {k + 1} of {len(runs)} (seed {k}): {run.error}"
    return statistics.fmean(r.metric for r in runs if r.metric is not None), None


def _inf_if_not_finite(error: float | None) -> float | None:
    return None if error is None else (error if math.isfinite(error) else math.inf)


@dataclass(frozen=True)
class Bounds:
    """When a search must stop: `max_evals` evaluations, or `time_budget` seconds from `started`
    (time.monotonic()). None: no such bound."""

    started: float
    max_evals: int | None = None
    time_budget: float | None = None

    def __post_init__(self) -> None:
        if self.max_evals is not None and self.max_evals < 1:
            raise ValueError(f"max_evals must be at least 1, not {self.max_evals}")
        if self.time_budget is not None and not self.time_budget > 0:
            raise ValueError(f"time_budget must be > 0 seconds, not {self.time_budget}")


_UNOBSERVED = object()


class Evaluator:
    """Runs and counts full evaluations; `trials` lists them in the order they ran (numbered from 1)."""

    def __init__(self, evaluate: Callable[[nn.Module], Any], keeper: ModelKeeper, bounds: Bounds, *,
                 journal: Journal | SharedJournal | None = None, ranks: Ranks | None = None,
                 emit: Callable[[TuneEvent], None] | None = None, training: bool = False, seeds: int = 1) -> None:
        self._evaluate = evaluate
        self.seeds = seeds if training else 1  # training runs per trial (`--seeds`), each one journal line
        # a training tune (`for_training`): parameters stay FP32 in every trial, and each evaluation starts with
        # every generator as the baseline's first run found it (`_start`, journaled with it for --resume)
        self.training = training
        self._start: dict[str, Any] | None = None
        self.evaluate_fn = evaluate  # the user's evaluate, for errors that name it
        self.keeper = keeper
        self.bounds = bounds
        self.journal = journal
        self.ranks = ranks or Ranks()
        self._emit = emit or (lambda event: None)
        self.trials: list[Trial] = []
        self.evals = 0
        self.eval_seconds = 0.0
        # the example inputs: they tell which parameters a trial's checkpoint stores lowered (None: none known)
        self.inputs: ModelInputs | None = None
        self._uses: ParameterUses | None | object = _UNOBSERVED  # for `lowered`'s prediction
        self._looked: tuple[Plan, Any, float] | None = None  # first_look's plan, output and seconds
        self._seen: tuple[Plan, dict[str, torch.dtype]] | None = None  # first_look's plan and what it lowered
        # the plan whose next evaluation has its first forward observed (`FirstCall`: the all-low trial's,
        # the plan written whenever it passes), and what that observation saw: the plan, the parameters held
        # lowered, the Observation (`deployed_seen`)
        self.watch: Plan | None = None
        self._watched: tuple[Plan, dict[str, torch.dtype], Observation] | None = None
        # calls every plan keeps FP32 (Candidates.fp32_calls): no choice of the search, so not in a trial's fp32
        self.kept: frozenset[OpInstance] = frozenset()
        self.forward_s = 0.0  # the seconds of output_error's last forward
        # what the forwards of mixed plans raised outside evaluate (output_error, lowered): one line each, in
        # the order first seen; each such plan counts as failing, the way a trial whose evaluate raises does
        self.raised: list[str] = []
        # record each evaluation's signature (tuner.search.repeatable): only the baseline's and the all-low
        # trial's are compared, so TuneSession.settle_noise turns it off (it hashes every input fed)
        self.signing = True
        self.warnings: list[str] = []  # what the baseline's run shows evaluate got wrong (tuner.search.misuse)

    def baseline(self) -> Trial:
        """One more run of the FP32 model as built. Not bounded; an evaluate that raises or gives no finite
        number ends the tune (there is nothing to compare plans with)."""
        n = sum(t.baseline for t in self.trials) + 1
        return self._run(BASELINE_KEY.format(n=n), f"FP32 baseline run {n}", None, (), Shares(), None)

    def trial(self, plan: Plan, label: str, shares: Shares, accept: Acceptance, kept: int | None = None) -> Trial:
        """The model under `plan`; passed when `accept` confirms its metric. An evaluate that raises, or gives
        NaN/inf, fails the trial. Raises SearchStopped when a bound is reached. `kept`: the FP32 instances
        the plan would record (Trial.kept; None: not counted)."""
        fp32 = tuple(sorted(i.label() for i in plan.fp32_instances if i not in self.kept))
        other = tuple(sorted(i.label() for i in plan.fallback_instances))
        return self._run(trial_key(fp32, other), label, plan, fp32, shares, accept, kept, other)

    def _check_bounds(self) -> None:
        if self.bounds.max_evals is not None and self.evals >= self.bounds.max_evals:
            raise SearchStopped(StopReason.MAX_EVALS)
        if self.bounds.time_budget is not None:
            took = [t.seconds for t in self.trials if not t.from_journal] or [0.0]
            if time.monotonic() - self.bounds.started + statistics.median(took) > self.bounds.time_budget:
                raise SearchStopped(StopReason.TIME_BUDGET)

    def _run(self, key: str, label: str, plan: Plan | None, fp32: tuple[str, ...], shares: Shares,
             accept: Acceptance | None, kept: int | None = None, fallback: tuple[str, ...] = ()) -> Trial:
        """A trial from the journal, or a new evaluation (written to the journal). `plan` None: the baseline.
        Under `seeds` > 1 (a training tune) each of its training runs is one journal line (`SEED_KEY`), and the
        trial's metric is their mean (failed when one of them fails)."""
        baseline = plan is None
        n = len(self.trials) + 1
        runs: list[tuple[_Run, bool]] = []
        for seed in range(self.seeds):
            run_key = key + (SEED_KEY.format(k=seed) if seed else "")
            run = self._cached(run_key)
            journaled = run is not None
            if run is None:
                if all(old for _, old in runs):  # the trial's first new run
                    if not baseline:
                        self.ranks.decide(self._check_bounds)  # rank 0's clock and count stop every rank at once
                    self._emit(TuneEvent(EventKind.EVALUATING, Evaluating(n, label)))
                run = self._call(plan, seed)
                self._journal(run_key, run, fp32, accept, baseline, fallback)
            runs.append((run, journaled))
        metric, error = _combined([r for r, _ in runs])
        first = runs[0][0]
        passed = baseline or (accept is not None and accept.confirms(metric))
        return self._record(Trial(n, label, fp32, metric, passed, sum(r.seconds for r, _ in runs), shares, error,
                                  all(journaled for _, journaled in runs), baseline, kept,
                                  sum(r.fed for r, _ in runs) or None, first.signature, fallback,
                                  tuple(r.metric for r, _ in runs) if self.seeds > 1 else (),
                                  ScalerSummary.joined([r.scaler for r, _ in runs])))

    def _cached(self, key: str) -> _Run | None:
        """The journaled run `key`, its draws replayed (`_replay_draws`); None when it is not in the journal."""
        cached = self.journal.get(key) if self.journal else None
        if cached is None:
            return None
        self._replay_draws(cached.get("generators"))
        if self.training and self._start is None and isinstance(cached.get("start"), dict) \
                and not self.ranks.distributed:  # (the journal holds rank 0's states only)
            self._start = cached["start"]
        fed, signature = cached.get("fed"), cached.get("signature")
        return _Run(None if cached.get("metric") is None else float(cached["metric"]), cached.get("error"),
                    float(cached["seconds"]), fed if isinstance(fed, int) and fed > 0 else 0,
                    signature if isinstance(signature, str) else None, {},
                    ScalerSummary.from_dict(cached.get("scaler")))

    def _journal(self, key: str, run: _Run, fp32: tuple[str, ...], accept: Acceptance | None,
                 baseline: bool, fallback: tuple[str, ...] = ()) -> None:
        if self.journal:
            passed = baseline or (accept is not None and accept.confirms(run.metric))
            self.journal.append(key, {"metric": run.metric, "passed": passed, "seconds": run.seconds,
                                      "error": run.error, "fp32": list(fp32), "fed": run.fed,
                                      "signature": run.signature, "generators": run.moved,
                                      **({"fallback": list(fallback)} if fallback else {}),
                                      **({"scaler": run.scaler.to_dict()} if run.scaler else {}),
                                      **({"start": self._start} if self.training and baseline else {})})

    def _same_draws(self, seed: int = 0) -> None:
        """A training tune's evaluation starts with every generator evaluate may draw from (torch's, CUDA's,
        Python's, NumPy's, those its module and closure hold) as the baseline's first run found it, so a
        training evaluate draws alike in every trial and its metric differs only by precision. Training run
        `seed` > 0 (`--seeds`) then starts each from that seed's own number (`seed_generators`)."""
        if not self.training:
            return
        if self._start is None:
            self._start = generator_states(self._evaluate)
        else:
            restore_generators(self._evaluate, self._start)
        if seed:
            seed_generators(self._evaluate, seed)

    def _replay_draws(self, moved: Any) -> None:
        """A journaled run's draws replayed: the generator states it left put back, so the first evaluation a
        resumed run makes draws what it drew in the interrupted run, and its metric and signature (the noise
        settling, TuneSession.settle_noise) are those the uninterrupted run would have had. Not under
        torchrun: the journal holds rank 0's states only."""
        if isinstance(moved, dict) and moved and not self.ranks.distributed:
            restore_generators(self._evaluate, moved)

    def _call(self, plan: Plan | None, seed: int = 0) -> _Run:
        """One `evaluate` on the lent model, with `plan` attached (None: FP32).

        Out of memory is not a result: the evaluation is retried once (after freeing what can be freed), and
        a second time raises OutOfMemory, with nothing journaled, so `resume` runs it again. Under torchrun
        it raises at once (a rank cannot retry alone: the others are in their own collectives).
        """
        try:
            return self._call_once(plan, seed)
        except OutOfMemory:
            if self.ranks.distributed:
                raise
            free_memory()
        return self._call_once(plan, seed)

    def _call_once(self, plan: Plan | None, seed: int = 0) -> _Run:
        baseline = plan is None
        metric: float | None = None
        error: str | None = None
        lowered = None if plan is None or self.training else self.lowered(plan)  # training: FP32 master weights
        with self._borrowed(baseline, lowered) as model:
            self._same_draws(seed)
            t0 = time.monotonic()
            signature = RunSignature(self._evaluate) if self.signing else None
            draws = signature.draws if signature is not None else Draws(self._evaluate)
            watch = BaselineWatch() if baseline and not seed else None  # evaluate's mistakes (misuse)
            count = _ForwardCount(model, signature, watch)
            if signature is not None:
                signature.start()
            else:
                draws.start()
            scalers: list[LossScaler] = []  # the tuner.LossScalers evaluate makes (`ScalerSummary`)
            try:
                with self._deployed(model, plan), watching() as scalers, self._observed(model, plan, lowered):
                    metric = _to_float(self._evaluate(model))
            except Exception as exc:
                if find_out_of_memory(exc) is not None:
                    raise out_of_memory(exc, "running evaluate") from exc
                if watch is not None:
                    watch.check(user_site(self._evaluate))  # evaluate's mistake (model.half()) over what it caused
                if baseline or self.ranks.distributed:  # a rank cannot tell whether the others raised too: stop all
                    raise
                error = _describe(exc)
            finally:
                count.remove()
                digest = None if signature is None else signature.finish()
                if signature is None:
                    draws.finish()
                self.keeper.guard.restore("evaluate")  # the next evaluation starts from the state the run did
            secs = time.monotonic() - t0
            if metric is not None and self.ranks.distributed:
                metric = self.ranks.agree(metric)  # the metric that counts: the all-reduced one, alike on every rank
            if watch is not None:
                watch.check(user_site(self._evaluate))  # before the loan ends: its own error, not a rebuild's
        if metric is not None and not math.isfinite(metric):
            if baseline:
                raise UserCodeError(f"evaluate returned {metric} for the FP32 model; the baseline must be finite")
            error, metric = f"metric is {metric}", None
        if metric is not None and count.calls == 0:
            raise UserCodeError(NO_FORWARD.format(which="the FP32 baseline" if baseline else "a trial"),
                                where=user_site(self._evaluate))
        if watch is not None:
            found = trained_warnings(watch, bool(self.keeper.written), self.training, user_site(self._evaluate))
            self.warnings.extend(w for w in found if w not in self.warnings)
        return _Run(metric, error, secs, count.fed, digest, draws.moved(), ScalerSummary.of(scalers))

    @contextlib.contextmanager
    def _borrowed(self, baseline: bool, lowered: dict[str, torch.dtype] | None) -> Iterator[nn.Module]:
        """The keeper's loan for one evaluate. When the FP32 baseline trained the model and building it again
        gave other weights (an unseeded build_model), the keeper's error asks whether --for-training was meant
        (a training tune builds the model again from the random state of its first build)."""
        done, mistake = False, None
        try:
            with self.keeper.borrowed("evaluate", lowered=lowered) as model:
                try:
                    yield model
                except UserCodeError as exc:
                    mistake = exc  # (misuse: model.half() in evaluate) the cause of a failed rebuild too
                    raise
                done = True
        except UserCodeError as exc:
            if baseline and mistake is not None and exc is not mistake:
                raise mistake from None
            if not (done and baseline and not self.training and self.keeper.written):
                raise
            raise UserCodeError(f"{exc}; evaluate changed {len(self.keeper.written)} parameter(s): if it trains "
                                "the model, did you mean --for-training? (it builds the model again from the random "
                                "state of its first build before every trial)") from exc

    @contextlib.contextmanager
    def _deployed(self, model: nn.Module, plan: Plan | None) -> Iterator[nn.Module]:
        """`model` (lent with `plan`'s lowered parameters held lowered) as `tuner.load` builds it from `plan`
        (None: the FP32 model as built), until the block ends."""
        if plan is None:
            yield model
            return
        attach(model, plan)  # the path tuner.load runs: what the search approves, deploys
        try:
            yield model
        finally:
            detach(model)

    @contextlib.contextmanager
    def _observed(self, model: nn.Module, plan: Plan | None,
                  lowered: dict[str, torch.dtype] | None) -> Iterator[None]:
        """Observe the first forward of `plan`'s evaluation when it is the plan to watch (`watch`) and that
        forward runs on the example inputs: the report's verifying forward, seen in the evaluation itself (the
        model as `tuner.load` builds it, `lowered` held lowered), at the cost of watching one forward. Not
        under torchrun, nor on a sharded model (its gathered parameters are named by `observe` alone)."""
        inputs = self.inputs
        if plan is None or plan != self.watch or inputs is None or self.ranks.distributed \
                or Sharding.of(model).sharded:
            yield
            return
        self.watch = None
        call = FirstCall(model, plan, lambda args, kwargs: same_inputs(ModelInputs(tuple(args), dict(kwargs)),
                                                                        inputs))
        ended = False
        try:
            yield
            ended = True
        finally:
            call.close(failed=not ended)
        if call.seen is not None:
            self._watched = (plan, dict(lowered or {}), call.seen)

    def deployed_seen(self, plan: Plan, lowered: Mapping[str, torch.dtype] | None) -> Observation | None:
        """The observed first forward of an evaluation of `plan` with `lowered` held lowered (`_observed`);
        None when no evaluation of it was observed so (the report then runs that forward)."""
        watched = self._watched
        if watched is None or lowered is None or watched[0] != plan or watched[1] != dict(lowered):
            return None
        return watched[2]

    def first_look(self, plan: Plan, inputs: ModelInputs) -> bool:
        """One observed forward (`tuner.measure.deployed.observe`) of `plan`, every eligible op low (no FP32
        instances), that serves three ends at the cost of one: it shows the plan runs under torch.autocast
        here (no module must stay FP32), it records the parameter uses `lowered` predicts from, and its output
        is `output_error`'s for this plan (the all-low guide point). False, with nothing kept, when the forward
        raises (the caller probes module by module, which names the culprit), when the plan has no native
        path (nothing to probe or predict), or under torchrun (a rank must not take another path alone)."""
        if self.ranks.distributed:
            return False
        with self.keeper.borrowed(light=True) as model:
            if not predictable(model, plan):
                return False
            t0 = time.monotonic()
            try:
                seen = observe(model, plan, inputs)
            except Exception:  # noqa: BLE001 - the probe that follows runs it again and classifies the error
                return False
            self._looked = (plan, detached_copy(seen.output), time.monotonic() - t0)
        self._seen = (plan, seen.lowered)  # `confirm_lowered`'s observation when `plan` is the one written
        self.inputs = inputs
        self._uses = uses_of(seen, plan)
        return True

    def output_error(self, plan: Plan, ref_out: Any) -> float | None:
        """The relative error of `plan`'s output on the example inputs against `ref_out` (FP32's), with the
        model as a trial runs it: one forward, no evaluate, not counted as an evaluation (the search's guide,
        tuner.search.guide). The parameters the plan's checkpoint stores lowered are held lowered where they
        are predicted without a forward (`lowered`); else they stay FP32 and the ops cast them as they run, to
        the same values, so only a parameter a trial stores lowered and an FP32 op also reads can differ, by
        its rounding. A guide, not a trial. inf when the output is not finite or the forward raises (a mixed
        plan the model's own code cannot run: a failing plan, as its trial would be; `raised` names the call);
        None without example inputs or when the outputs do not pair up."""
        if self.inputs is None:
            return None
        looked, self._looked = self._looked, None
        if looked is not None and looked[0] == plan:  # first_look ran this very forward
            self.forward_s = looked[2]
            return _inf_if_not_finite(relative_error(looked[1], ref_out))
        t0 = time.monotonic()
        with self.keeper.borrowed(lowered=self._predicted(plan), light=True) as model, torch.no_grad():
            attach(model, plan)
            try:
                error = relative_error(call_forward(model, self.inputs), ref_out)
            except UserCodeError as exc:  # the FP32 forward ran these inputs (Candidates.ref_out): the plan raised
                self.note_raised(exc)
                error = math.inf
            finally:
                detach(model)
        self.forward_s = time.monotonic() - t0
        return _inf_if_not_finite(error)

    def lowered(self, plan: Plan) -> dict[str, torch.dtype]:
        """The parameters `plan`'s checkpoint stores lowered: predicted from one observation where the regions
        allow (`tuner.measure.lowering`), else observed with a forward on the example inputs."""
        if self.inputs is None:
            return {}
        try:
            if self._uses is _UNOBSERVED:
                with self.keeper.borrowed(light=True) as model:
                    self._uses = parameter_uses(model, plan, self.inputs, self.kept)
            predicted = self._predicted(plan)
            if predicted is not None:
                return predicted
            with self.keeper.borrowed(light=True) as model:  # the trial that follows compares the bytes first
                return weight_dtypes(model, plan, self.inputs)
        except Exception as exc:  # a plan the model's code cannot run: its trial raises too, and fails
            if find_out_of_memory(exc) is not None:
                raise out_of_memory(exc, "observing a plan's forward") from exc
            self.note_raised(exc)
            return {}

    def note_raised(self, exc: BaseException) -> None:
        """Remember what a plan's forward raised (outside evaluate), once per distinct line."""
        original = exc.original if isinstance(exc, UserCodeError) and exc.original is not None else exc
        where = raised_at(original)
        line = exc_line(original, 200) + (f" ({where})" if where else "")
        if line not in self.raised:
            self.raised.append(line)

    def _predicted(self, plan: Plan) -> dict[str, torch.dtype] | None:
        """`lowered` where it needs no forward; None where it would (or nothing was observed yet)."""
        uses = self._uses
        return predicted_lowered(self.keeper.modules, uses, plan) if isinstance(uses, ParameterUses) else None

    def confirm_lowered(self, model: nn.Module, plan: Plan) -> dict[str, torch.dtype] | None:
        """NotAsClaimed unless a forward of `plan` lowers the parameters the trials were told it lowers (the
        check of the prediction on the plan that gets reported). Returns what that forward observed (the
        parameters `plan`'s checkpoint stores lowered: the report's plan pass needs no forward of its own for
        them), or None when nothing was predicted, so nothing observed. When `plan` is the one `first_look`
        observed (the all-low plan, written whenever it passes), that observation is the forward: the same
        FP32 weights, plan and inputs, seeded alike (`observe`), so running it again would see the same
        uses; `needs_forward` tells the caller whether `model` must be lent for one."""
        if self.inputs is None or not isinstance(self._uses, ParameterUses):
            return None
        predicted = predicted_lowered(model, self._uses, plan)
        if predicted is None:
            return None
        seen = self._seen[1] if not self.needs_forward(plan) and self._seen is not None \
            else weight_dtypes(model, plan, self.inputs)
        if seen != predicted:
            wrong = sorted(set(seen).symmetric_difference(predicted))
            raise NotAsClaimed(f"the trials held {len(wrong)} parameter(s) in another dtype than the plan stores "
                               f"them (an mpt bug): {', '.join(wrong[:5])}")
        return seen

    def needs_forward(self, plan: Plan) -> bool:
        """Whether `confirm_lowered(model, plan)` runs a forward of `model` (False: `first_look` observed
        `plan` already, or there is nothing to confirm), so the caller lends the module tree alone."""
        if self.inputs is None or not isinstance(self._uses, ParameterUses):
            return False
        return self._seen is None or self._seen[0] != plan

    def _record(self, trial: Trial) -> Trial:
        self.evals += 1
        self.eval_seconds += trial.seconds
        self.trials.append(trial)
        self._emit(TuneEvent(EventKind.TRIAL, trial))
        return trial

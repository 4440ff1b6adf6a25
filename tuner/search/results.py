"""What a tune answers (TuneResult, Trial, progress events); what it is asked is tuner.options.tune.TuneOptions.

The work itself is `tuner.search.session.TuneSession`: FP32 baseline (with its
noise) -> candidates -> all-low trial -> ranking -> PrecisionSearch -> a Plan
confirmed by a full evaluation.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import torch

from tuner.engine.scaler import ScalerSummary
from tuner.measure.deployed import Observation
from tuner.measure.recorded import PlanRecord
from tuner.measure.shares import Shares
from tuner.options.tune import RankMethod, TuneOptions
from tuner.policy.plan import OpInstance, Plan
from tuner.search.phases import PhaseClock


class TuneStatus(str, enum.Enum):
    MET = "ok"  # a plan confirmed by a full evaluation meets the target
    NOT_MET = "not_met"  # nothing passed: the plan is all FP32


class StopReason(str, enum.Enum):
    """Why a search ended before it was done; the best plan confirmed so far is kept."""

    MAX_EVALS = "max_evals"
    TIME_BUDGET = "time_budget"
    INTERRUPTED = "interrupted"

    def describe(self, options: TuneOptions) -> str:
        return {StopReason.MAX_EVALS: f"the limit of {options.max_evals} evaluations was reached",
                StopReason.TIME_BUDGET: f"the time budget of {options.time_budget:g} s was reached"
                if options.time_budget else "the time budget was reached",
                StopReason.INTERRUPTED: "interrupted"}[self]


class EventKind(str, enum.Enum):
    BUILDING = "building"  # the output folder is claimed (nothing refused the run): the model is built next
    BASELINE = "baseline"
    CANDIDATES = "candidates"
    RANK = "rank"
    EVALUATING = "evaluating"  # a full evaluation starts
    TRIAL = "trial"
    WARNING = "warning"  # something the user should know while it runs (fp16 on a CPU without fp16 kernels)
    DONE = "done"


@dataclass(frozen=True)
class Trial:
    """One full evaluation: the FP32 baseline (its samples) or a plan tried by the search.

    `n` counts from 1 in the order the evaluations ran: the baseline runs first
    (once, or more: tuner.search.noise). `shares` is the trial's lower-precision share (tuner.measure.shares;
    zero for the baseline). `label` says what the trial changed from the trial before it
    (tuner.search.changes). `fp32` lists the instances it kept FP32; `kept` is how many of
    them its plan records once the overrides that change nothing are dropped (None: not known). `fed`
    counts the tensor elements evaluate passed to the model's forward (None: not known), which sizes the
    search's guide the same way in every run (tuner.search.guide.guide_limits). `signature` digests what
    evaluate fed the model and drew at random (tuner.search.repeatable; None: not read, or not recorded:
    only the evaluations until the baseline is settled record one): two runs with the same one give the same
    metric. `scaler` sums what the `tuner.LossScaler`s its evaluate made did (None: it made none).
    """

    n: int
    label: str
    fp32: tuple[str, ...]
    metric: float | None
    passed: bool
    seconds: float
    shares: Shares
    error: str | None = None
    from_journal: bool = False
    baseline: bool = False
    kept: int | None = None
    fed: int | None = None
    signature: str | None = None
    fallback: tuple[str, ...] = ()  # the instances it ran in the fallback dtype (a fallback chain), not in FP32
    seeds: tuple[float | None, ...] = ()  # under --seeds: each training run's metric (the metric is their mean)
    scaler: ScalerSummary | None = None  # what the tuner.LossScalers its evaluate made did (None: none)


@dataclass(frozen=True)
class BaselineMeasured:
    """The FP32 baseline is known: its value, its noise (`spread`, 0 for a deterministic evaluate) and the target."""

    value: float
    spread: float
    target: float
    lower_is_better: bool

    @property
    def noisy(self) -> bool:
        return self.spread > 0


@dataclass(frozen=True)
class CandidatesFound:
    """`count` op instances run in `dtype` under `preset` and change the numbers; `all_low_error` is the relative
    error of the example output with all of them lowered."""

    count: int
    dtype: str
    preset: str
    all_low_error: float


@dataclass(frozen=True)
class RankProgress:
    """`done` of `total` candidates ranked by `method`."""

    method: RankMethod
    done: int
    total: int


@dataclass(frozen=True)
class Evaluating:
    """Full evaluation number `n` (its trial number) starts; `label` says what it tries."""

    n: int
    label: str


@dataclass(frozen=True)
class RunWarning:
    """A warning about the run as a whole, sent as soon as it is known so the user can stop a run that will be
    slow; a renderer decides when to show it (the CLI: before the first trial's line, once evaluate has run)."""

    text: str

    def __post_init__(self) -> None:
        if not self.text.strip():
            raise ValueError("a warning needs a text")


EventPayload = BaselineMeasured | CandidatesFound | RankProgress | Evaluating | Trial | RunWarning | None

# what each kind of event carries (BUILDING, DONE: nothing)
_PAYLOADS: dict[EventKind, type] = {EventKind.BASELINE: BaselineMeasured, EventKind.CANDIDATES: CandidatesFound,
                                    EventKind.RANK: RankProgress, EventKind.EVALUATING: Evaluating,
                                    EventKind.TRIAL: Trial, EventKind.WARNING: RunWarning,
                                    EventKind.BUILDING: type(None), EventKind.DONE: type(None)}


@dataclass(frozen=True)
class TuneEvent:
    """Progress for a renderer: values, not sentences; the renderer words them (mpt_cli.tune_cmd)."""

    kind: EventKind
    payload: EventPayload = None

    def __post_init__(self) -> None:
        wanted = _PAYLOADS[self.kind]
        if not isinstance(self.payload, wanted):
            raise TypeError(f"a {self.kind.value} event carries a {wanted.__name__}, "
                            f"not a {type(self.payload).__name__}")


@dataclass
class TuneResult:
    plan: Plan
    status: TuneStatus
    baseline: float
    target: float
    metric: float | None
    trials: list[Trial]
    evals: int
    stopped: StopReason | None
    candidates: list[OpInstance]
    scores: dict[str, float]
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    eval_seconds: float = 0.0
    user_seconds: float = 0.0  # the user's build() and example_inputs(), besides evaluate
    inputs: Any = None  # tuner.core.inputs.ModelInputs of the example forward call
    warnings: list[str] = field(default_factory=list)
    noise: float = 0.0  # the baseline's spread (0: a deterministic evaluate)
    rebuilds: int = 0  # how often evaluate changed the model and it was built again
    chosen: int | None = None  # the number of the trial that confirmed the plan (None: not met)
    flop_shares: dict[str, float] = field(default_factory=dict)  # candidate label -> its share of the FLOPs
    # the parameters the plan's checkpoint stores lowered, as a deployed forward of the plan observed them at the
    # end of the tune (None: not observed; the report's plan pass observes them then)
    lowered: dict[str, torch.dtype] | None = None
    # the written plan's recorded forward (its shares and claims; None: not recorded, the report records it)
    recorded: PlanRecord | None = None
    phases: PhaseClock | None = None  # seconds by phase, mpt's own and inside evaluate (tuner.search.phases)
    # the candidates the range rule kept FP32 before the search (label -> why: tuner.measure.ranges.RangeReason)
    range_kept: dict[str, str] = field(default_factory=dict)
    # the labels whose score is the ranking's first-order estimate; the others were measured with that op alone
    # in the lower dtype, its inputs as it receives them (tuner.measure.ranking.rank_exact)
    estimated: frozenset[str] = frozenset()
    # the deployed forward of the written plan, observed in the evaluation that confirmed it (its first forward,
    # on the example inputs, with `lowered` held lowered: `deployed.FirstCall`); None: the report runs one
    deployed: Observation | None = None

    def __repr__(self) -> str:
        """One line a notebook can show: the outcome, not every trial and the example inputs' tensors."""
        metric = "None" if self.metric is None else f"{self.metric:.6g}"
        return (f"TuneResult(status={self.status.name}, baseline={self.baseline:.6g}, metric={metric}, "
                f"target={self.target:.6g}, evals={self.evals}, chosen={self.chosen}, "
                f"fp32={len(self.plan.fp32_instances)} of {len(self.candidates)} op instances, "
                f"dtype={self.plan.dtype!r})")

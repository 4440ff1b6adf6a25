"""What the outputs of a tune say beyond the TuneResult, measured once: `TuneReport`.

`tuner.report.measuring.measure_report` fills it from the model (one recorded
forward under the plan, the latency, the execution path); the writer adds
what only writing tells (the checkpoint's size, the plan's checkpoint sha256)
and the renderers (report.json, report.md, search.html) and the CLI's summary
read it beside the TuneResult: every number they write comes from one of the two.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from tuner.engine.native import Execution
from tuner.measure.shares import Shares
from tuner.policy.plan import Plan
from tuner.report.checkpoint import CheckpointInfo
from tuner.report.latency import Latency
from tuner.report.oplists import TypeLevel
from tuner.search.results import Trial


@dataclass(frozen=True)
class TuneReport:
    """The chosen plan as written, measured on the model it was tuned on.

    `plan` is the result's plan with the model it was made for (and, once
    written, the checkpoint's sha256). `shares` are the plan's lower-precision
    shares from one recorded forward; `trials` are the result's trials with the
    chosen one's shares replaced by these, so every output shows the same
    numbers. `latency` is None when it was not timed (`latency=False`) or the
    tuned model raised (a warning says why). `warnings` are the result's and
    the measuring step's. `lowered` names the parameters the checkpoint stores
    in the lower dtype. `checkpoint` is None until the writer saved it.
    `lists` is the plan as op-type lists (the list files), with the types they cost where they cannot
    express it. `device` is the device the tune ran on ("cpu", "cuda": report.md's training loop names it).
    `seconds` is the time spent measuring and writing the outputs. `created` is when
    it was measured (UTC, ISO 8601): report.json states it; plan.yaml carries no time,
    so a re-tune with the same result rewrites it byte for byte.
    """

    plan: Plan
    shares: Shares
    trials: tuple[Trial, ...]
    latency: Latency | None
    execution: Execution
    warnings: tuple[str, ...]
    lowered: Mapping[str, torch.dtype]
    seconds: float = 0.0
    checkpoint: CheckpointInfo | None = None
    created: str = ""
    lists: TypeLevel | None = None
    device: str = "cpu"

    def __post_init__(self) -> None:
        object.__setattr__(self, "trials", tuple(self.trials))
        object.__setattr__(self, "warnings", tuple(self.warnings))
        if self.seconds < 0:
            raise ValueError(f"seconds must be >= 0, found {self.seconds}")

    def written(self, checkpoint: CheckpointInfo, sha256: str, seconds: float) -> TuneReport:
        """This report once the checkpoint is saved: its info, its digest in the plan, `seconds` more spent."""
        return dataclasses.replace(self, checkpoint=checkpoint, seconds=self.seconds + seconds,
                                   plan=dataclasses.replace(self.plan, checkpoint_sha256=sha256))

"""A whole `mpt tune` run into an output folder: claim it, fingerprint, journal, search, measure, write outputs.

This is what the CLI calls; it only parses options and renders the events and
the returned `TuneRun`.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tuner.core.devices import check_device
from tuner.core.errors import Interrupted
from tuner.core.fingerprint import file_digests, source_digest
from tuner.core.loader import UserModel
from tuner.core.output_files import JOURNAL_NAME, OUTPUT_FILES
from tuner.core.torch_state import refuse_active_autocast
from tuner.options.tune import TuneOptions
from tuner.report.measuring import measure_report
from tuner.report.outcome import TuneReport
from tuner.report.writer import withdraw_plan, write_outputs
from tuner.search.distributed import Ranks, SharedJournal
from tuner.search.results import StopReason, TuneEvent, TuneResult, TuneStatus
from tuner.search.session import TuneSession
from tuner.workspace.folder import OutputFolder
from tuner.workspace.journal import Journal, RunFingerprint
from tuner.workspace.keeper import ModelKeeper
from tuner.workspace.modelref import model_ref_for


@dataclass(frozen=True)
class TuneRun:
    """A finished `mpt tune`: the search's result, the folder, and the report as written (renderers' input)."""

    result: TuneResult
    out: Path
    report: TuneReport | None  # None: nothing written (interrupted before a plan was confirmed; not rank 0)

    @property
    def wrote_outputs(self) -> bool:
        return self.report is not None


def tune_into_folder(user: UserModel, options: TuneOptions, out: str | Path, *, resume: bool = False,
                     overwrite: bool = False, specs: Mapping[str, str | None] | None = None,
                     on_event: Callable[[TuneEvent], None] | None = None,
                     started: float | None = None, latency: bool = True, ranks: Ranks | None = None) -> TuneRun:
    """Tune `user`'s model and write the outputs into `out`, which no other run may use meanwhile.

    `specs` are the build/eval/inputs names the user gave (recorded in the
    plan so `mpt check` rebuilds the same model). `started` is when the time
    budget starts (time.monotonic()); default now. `latency=False` skips
    timing the tuned model against FP32 (report.json's `latency_ms` is null):
    it is not a setting of the search, so it is not in the journal's fingerprint.

    Under torchrun (`ranks`, see tuner.search.distributed) every rank calls this: every rank builds the model and
    runs the same search, and rank 0 alone claims `out`, keeps the journal and writes the outputs (its
    checkpoint and latency come from its own replica of the model); the other ranks return with no report.
    An interrupt on any rank raises Interrupted on it, with nothing written: the journal keeps the finished
    evaluations for `resume`.
    """
    ranks = ranks or Ranks()
    started = time.monotonic() if started is None else started
    start_state = refuse_active_autocast("mpt tune")  # before anything is claimed or built
    speed_warning = check_device(options.device, options.dtype)
    claim = OutputFolder.claim(out, resume=resume, overwrite=overwrite, outputs=OUTPUT_FILES) if ranks.is_main \
        else contextlib.nullcontext(None)
    with claim as folder:
        path = Path(out) if folder is None else folder.path
        t0 = time.monotonic()
        keeper = ModelKeeper(user.build, options.device, start=start_state)
        build_seconds = time.monotonic() - t0
        files = user.files or ((user.path,) if user.path.is_file() else ())  # tuner.tune(out=) from a notebook: none
        source = source_digest(files)
        ranks.same_model(source, keeper.weights_digest)  # under torchrun: every rank tunes rank 0's model
        kept: Journal | None = None
        if folder is not None:
            fingerprint = RunFingerprint(source=source, weights=keeper.weights_digest,
                                         settings=options.settings(), files=file_digests(files, base=user.path.parent))
            kept = Journal(folder.path / JOURNAL_NAME, fingerprint, resume=resume)
        journal = SharedJournal(kept, ranks) if ranks.distributed else kept
        inputs = user.example_inputs if user.inputs_fn is not None else None
        session = TuneSession(user.build, user.evaluate, inputs, options, journal=journal, on_event=on_event,
                              started=started, keeper=keeper, ranks=ranks)
        session.user_seconds += build_seconds
        result = session.run()
        if speed_warning:
            result.warnings.append(speed_warning)
        if result.stopped is StopReason.INTERRUPTED and ranks.distributed:
            raise Interrupted()  # the other ranks may be anywhere: stop them all (journal kept)
        if (result.stopped is StopReason.INTERRUPTED and result.status is not TuneStatus.MET) or folder is None:
            return TuneRun(result, path, None)
        given = dict(specs or {})
        ref = model_ref_for(user, folder.path, build=given.get("build"), eval=given.get("eval"),
                            inputs=given.get("inputs"), model=keeper.model, weights=keeper.weights_digest)
        withdraw_plan(folder.path)  # an interrupt while measuring leaves no plan.yaml, as one while writing
        report = measure_report(result, keeper.model, model_ref=ref, device=options.device, latency=latency)
        report = write_outputs(result, report, folder.path, model=keeper.model)
        return TuneRun(result, folder.path, report)

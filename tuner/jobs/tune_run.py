"""A whole `mpt tune` run into an output folder: claim it, fingerprint, journal, search, measure, write outputs.

This is what the CLI calls; it only parses options and renders the events and
the returned `TuneRun`.
"""
from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tuner.core.devices import check_device
from tuner.core.errors import ConfigError, Interrupted
from tuner.core.fingerprint import file_digests, source_digest
from tuner.core.hf import is_sentence_transformers
from tuner.core.loader import UserModel
from tuner.core.output_files import JOURNAL_NAME, OUTPUT_FILES, STAGING_NAME
from tuner.core.sharding import Sharding
from tuner.core.torch_state import refuse_active_autocast
from tuner.jobs.prepare import FIDELITY_KEYS
from tuner.options.tune import TuneOptions
from tuner.policy.plan import ModelRef
from tuner.report.measuring import measure_report
from tuner.report.outcome import TuneReport
from tuner.report.pretrained import check_saved_target, save_pretrained_folder
from tuner.report.sharded import save_shards
from tuner.report.writer import withdraw_plan, write_outputs
from tuner.search.distributed import Ranks, SharedJournal
from tuner.search.repeatable import replaying
from tuner.search.results import EventKind, RunWarning, StopReason, TuneEvent, TuneResult, TuneStatus
from tuner.search.session import TuneSession
from tuner.workspace.folder import OutputFolder
from tuner.workspace.journal import Journal, RunFingerprint
from tuner.workspace.keeper import ModelKeeper
from tuner.workspace.manifest import Manifest
from tuner.workspace.modelref import model_ref_for
from tuner.workspace.reference import first_output_of


@dataclass(frozen=True)
class TuneRun:
    """A finished `mpt tune`: the search's result, the folder, and the report as written (renderers' input)."""

    result: TuneResult
    out: Path
    report: TuneReport | None  # None: nothing written (interrupted before a plan was confirmed; not rank 0)
    saved: Path | None = None  # the Hugging Face folder `save_pretrained` wrote

    @property
    def wrote_outputs(self) -> bool:
        return self.report is not None


def tune_into_folder(user: UserModel, options: TuneOptions, out: str | Path, *, resume: bool = False,
                     overwrite: bool = False, specs: Mapping[str, str | None] | None = None,
                     on_event: Callable[[TuneEvent], None] | None = None,
                     started: float | None = None, latency: bool = True, ranks: Ranks | None = None,
                     consolidate: bool = False, save_pretrained: str | Path | None = None) -> TuneRun:
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
    evaluations for `resume`. A sharded model (FSDP2, tensor parallel: `tuner.core.sharding`) is measured by
    every rank together and its checkpoint written by every rank (`tuner.report.sharded`; `consolidate`: also
    one whole model.safetensors). `save_pretrained`: an `hf:` run also writes the tuned model there as a
    Hugging Face folder with its plan (`tuner.report.pretrained`), checked before `out` is claimed.
    """
    ranks = ranks or Ranks()
    started = time.monotonic() if started is None else started
    start_state = refuse_active_autocast("mpt tune")  # before anything is claimed or built
    saved = None if save_pretrained is None else Path(save_pretrained)
    if saved is not None and ranks.is_main:
        _check_saved(user, saved, Path(out), replace=resume or overwrite)
    speed_warning = check_device(options.device, options.dtype)
    claim = OutputFolder.claim(out, resume=resume, overwrite=overwrite, outputs=OUTPUT_FILES) if ranks.is_main \
        else contextlib.nullcontext(None)
    with claim as folder:
        path = Path(out) if folder is None else folder.path
        if on_event is not None and ranks.is_main:  # after every refusal that needs no model, never before one
            on_event(TuneEvent(EventKind.BUILDING))
        t0 = time.monotonic()
        keeper = ModelKeeper(user.build, options.device, start=start_state,
                             before_build=replaying(user.build) if options.for_training else None)
        build_seconds = time.monotonic() - t0
        sharding = Sharding.of(keeper.model)  # a layout mpt cannot run is refused before anything runs
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
                              started=started, keeper=keeper, ranks=ranks,
                              fp32_output=first_output_of(user.eval_fn))
        session.user_seconds += build_seconds
        if speed_warning and on_event is not None and ranks.is_main:  # before the search, not after it
            on_event(TuneEvent(EventKind.WARNING, RunWarning(speed_warning)))
        result = session.run()
        if speed_warning:
            result.warnings.append(speed_warning)  # report.md and report.json record it too
        if result.stopped is StopReason.INTERRUPTED and ranks.distributed:
            raise Interrupted()  # the other ranks may be anywhere: stop them all (journal kept)
        if sharding.sharded and not (result.stopped is StopReason.INTERRUPTED and result.status is not TuneStatus.MET):
            return _finish_sharded(result, keeper, folder, path, ranks, user=user, specs=specs, options=options,
                                   latency=latency, consolidate=consolidate)
        if (result.stopped is StopReason.INTERRUPTED and result.status is not TuneStatus.MET) or folder is None:
            if folder is not None:
                folder.discard_unused()  # stopped before its first trial: nothing left to refuse a rerun
            return TuneRun(result, path, None)
        ref = _model_ref(user, folder, keeper, specs, options)
        withdraw_plan(folder.path)  # an interrupt while measuring leaves no plan.yaml, as one while writing
        # the module tree, its weights as the last trial held them: put back to FP32 (`as_built`) only for a
        # forward that needs them, so the lowered weights stay held (or are packed once) for verifying and writing
        report = measure_report(result, keeper.checked, model_ref=ref, device=options.device, latency=latency,
                                hold=keeper.holding, as_built=lambda: keeper.model)
        report = write_outputs(result, report, folder.path, model=keeper.modules, hold=keeper.holding)
        if saved is not None:
            save_pretrained_folder(keeper.model, user.path, folder.path, saved, replace=resume or overwrite)
        return TuneRun(result, folder.path, report, saved)


def _check_saved(user: UserModel, saved: Path, out: Path, *, replace: bool) -> None:
    """ConfigError (exit 2) before anything is written when `save_pretrained` cannot be honoured: a model file's
    model has no Hugging Face folder to save as, nor a sentence-transformers model one `from_pretrained` reads."""
    if not user.hf:
        raise ConfigError("`save_pretrained` writes a Hugging Face folder, so it takes an hf:DIR model; a model "
                          "file's tuned model loads with tuner.load(build_model(), OUT)")
    if is_sentence_transformers(user.path):
        raise ConfigError("`save_pretrained`: a sentence-transformers folder is not saved as a Hugging Face folder "
                          "(from_pretrained reads no SentenceTransformer); load the run with "
                          "tuner.load(\"hf:DIR\", OUT)")
    check_saved_target(saved, out, replace=replace)


def _model_ref(user: UserModel, folder: OutputFolder, keeper: ModelKeeper, specs: Mapping[str, str | None] | None,
               options: TuneOptions) -> ModelRef:
    """The plan's record of the model it was made for (with a built-in metric's settings, so check recomputes it)."""
    given = dict(specs or {})
    fidelity = {k: getattr(options, k) for k in FIDELITY_KEYS} if options.metric is not None else None
    return model_ref_for(user, folder.path, build=given.get("build"), eval=given.get("eval"),
                         inputs=given.get("inputs"), model=keeper.modules, weights=keeper.weights_digest,
                         fidelity=fidelity)


def _finish_sharded(result: TuneResult, keeper: ModelKeeper, folder: OutputFolder | None, path: Path, ranks: Ranks, *,
                    user: UserModel, specs: Mapping[str, str | None] | None, options: TuneOptions,
                    latency: bool, consolidate: bool) -> TuneRun:
    """A sharded model's outputs: every rank runs the measuring forwards and writes its shards of the
    checkpoint into a folder rank 0 made; rank 0 then commits them with the other outputs."""
    ref = _model_ref(user, folder, keeper, specs, options) if folder is not None else None
    if folder is not None:
        withdraw_plan(folder.path)
    report = measure_report(result, keeper.model, model_ref=ref, device=options.device, latency=latency,
                            decide=ranks.broadcast)
    made = None
    if folder is not None:
        made = tempfile.mkdtemp(prefix=f"{STAGING_NAME}-", dir=folder.path)
        Manifest(folder.path).add_staging(Path(made).name)  # a kill from here on leaves it for the next run
    where = Path(str(ranks.broadcast(made)))
    try:
        shards = save_shards(keeper.model, report.lowered, where, consolidate=consolidate, main=ranks.is_main)
        ranks.broadcast(None)  # every rank's shards are on disk before rank 0 moves them
        if folder is None:
            return TuneRun(result, path, None)
        report = write_outputs(result, report, folder.path, model=keeper.model, shards=shards)
        return TuneRun(result, folder.path, report)
    finally:
        if folder is not None:
            shutil.rmtree(where, ignore_errors=True)
            with contextlib.suppress(OSError):
                Manifest(folder.path).drop_staging(where.name)  # read again: the writer recorded its files

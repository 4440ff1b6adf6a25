"""Everything `mpt tune` writes into the output folder, committed as a set; the writer only serializes.

What the files say is measured before (`tuner.report.measuring.measure_report`)
and rendered by pure functions (oplists, json_report, markdown, search_page);
the file names and their order are `tuner.core.output_files`. The old
`plan.yaml` is removed first, every file is written into a staging folder
inside the output folder, and the files are then renamed into place with
`plan.yaml` (the file that claims success) last. A failed write (disk full,
permission) raises OutputError naming the file and the cause and leaves no
plan.yaml; an interrupted write leaves none either. The folder's manifest
(tuner.workspace.manifest) records every committed file's sha256; a file in
the folder that mpt did not write is never replaced (ConfigError, exit 2).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from torch import nn

from tuner.core.errors import OutputError
from tuner.core.fileio import atomic_write_text
from tuner.core.fingerprint import tree_sha256
from tuner.core.inputs import ModelInputs
from tuner.core.output_files import (
    CHECKPOINT_NAME,
    COMMITTED,
    FP32_OPS_NAME,
    HMP_FP32_NAME,
    LOWER_OPS_NAME,
    MANIFEST_NAME,
    PLAN_NAME,
    REPORT_JSON_NAME,
    REPORT_MD_NAME,
    SEARCH_PAGE_NAME,
    SHARDED_CHECKPOINT_NAME,
    STAGING_NAME,
    hmp_lower_name,
)
from tuner.measure.deployed import Holding, stored_as
from tuner.report.checkpoint import CheckpointInfo, save_checkpoint
from tuner.report.json_report import report_json
from tuner.report.markdown import report_markdown
from tuner.report.oplists import list_text, type_level
from tuner.report.outcome import TuneReport
from tuner.report.search_page import search_page
from tuner.report.sharded import SavedShards
from tuner.report.verdict import plan_header
from tuner.search.results import TuneResult
from tuner.workspace.manifest import Manifest


@contextlib.contextmanager
def _writing(out: Path, name: str) -> Iterator[None]:
    """OSError while writing `name` -> OutputError naming the final path and the cause."""
    try:
        yield
    except OSError as exc:
        raise OutputError(f"cannot write {out / name}: {exc.strerror or exc}") from None


def withdraw_plan(out: str | Path) -> None:
    """Remove the folder's plan.yaml: from now until the outputs are committed, nothing in it claims success.

    ConfigError when a plan.yaml there is not the one mpt wrote (tuner.workspace.manifest): it is left alone.
    """
    out = Path(out)
    manifest = Manifest(out)
    manifest.check_ours([PLAN_NAME])
    with _writing(out, PLAN_NAME):
        (out / PLAN_NAME).unlink(missing_ok=True)
    manifest.forget(PLAN_NAME)


def write_outputs(result: TuneResult, report: TuneReport, out: str | Path, *, model: nn.Module,
                  shards: SavedShards | None = None, hold: Holding = stored_as) -> TuneReport:
    """Write the outputs as a set (see the module docstring); returns the report as written.

    `report` is `measure_report(result, model, ...)`. `model` is the FP32 model
    as built: its weights go into the checkpoint (no copy of the model is
    made), the parameters `report.lowered` names stored in the lower dtype. The
    returned report adds the checkpoint's info, its sha256 in the plan and the
    time spent writing. `shards`: a sharded model's checkpoint, already written by every rank
    (`tuner.report.sharded`), committed with the rest instead of `model`'s. `hold`: how the lowered
    parameters are held while written (`deployed.Holding`).
    """
    out = Path(out)
    manifest = Manifest(out)
    manifest.check_ours(COMMITTED)  # before anything is written: a file mpt did not write is never replaced
    withdraw_plan(out)
    with _writing(out, STAGING_NAME):
        stage = Path(tempfile.mkdtemp(prefix=f"{STAGING_NAME}-", dir=out))
        manifest.add_staging(stage.name)  # a kill from here on leaves it for the next run to remove
    try:
        report = _write_staged(result, report, stage, out, model=model, shards=shards, hold=hold)
        names = [name for name in COMMITTED if (stage / name).exists()]
        digests = {name: report.plan.checkpoint_sha256 if name == CHECKPOINT_NAME and shards is None
                   else tree_sha256(stage / name) for name in names}
        with _writing(out, MANIFEST_NAME):
            for name in COMMITTED:
                if name not in names and (out / name).exists():  # from an earlier run (ours: checked above)
                    manifest.remove(name)
            manifest.writing(*names)
        for name in names:
            with _writing(out, name):
                if (out / name).is_dir():
                    shutil.rmtree(out / name)
                os.replace(stage / name, out / name)
        with _writing(out, MANIFEST_NAME):
            manifest.wrote({n: d for n, d in digests.items() if d})
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        with contextlib.suppress(OSError):
            manifest.drop_staging(stage.name)
    return report


def _write_staged(result: TuneResult, report: TuneReport, stage: Path, out: Path, *,
                  model: nn.Module, shards: SavedShards | None, hold: Holding) -> TuneReport:
    """Every committed file into `stage`, in the committed order; OSError -> OutputError naming the file."""
    t0 = time.monotonic()
    lists = report.lists or type_level(result.plan)
    (hmp_lower, hmp_fp32), (gaudi_lower, gaudi_fp32) = lists.names("hmp"), lists.names("gaudi")
    for name, ops in ((LOWER_OPS_NAME, gaudi_lower), (FP32_OPS_NAME, gaudi_fp32),
                      (hmp_lower_name(result.plan.dtype), hmp_lower), (HMP_FP32_NAME, hmp_fp32)):
        with _writing(out, name):
            atomic_write_text(stage / name, list_text(ops))
    if shards is not None:
        with _writing(out, SHARDED_CHECKPOINT_NAME):
            digest = shards.move_into(stage)
        info = CheckpointInfo(lowered=shards.lowered, bytes=shards.bytes, fp32_bytes=shards.fp32_bytes)
        report = report.written(info, digest, time.monotonic() - t0)
    elif not result.plan.for_training:  # a training plan's weights are the user's FP32 ones: no checkpoint
        report = _write_checkpoint(result, report, stage, out, model=model, t0=t0, hold=hold)
    with _writing(out, PLAN_NAME):
        report.plan.save(stage / PLAN_NAME, header=plan_header(result))
    renderers = ((REPORT_JSON_NAME, report_json), (SEARCH_PAGE_NAME, lambda r, rep: search_page(r, rep, out)),
                 (REPORT_MD_NAME, lambda r, rep: report_markdown(r, rep, out)))
    for name, render in renderers:
        with _writing(out, name):
            atomic_write_text(stage / name, render(result, report))
    return report


def _write_checkpoint(result: TuneResult, report: TuneReport, stage: Path, out: Path, *, model: nn.Module,
                      t0: float, hold: Holding) -> TuneReport:
    """model.safetensors into `stage`, checked against the trials' weights; the report with its info."""
    with _writing(out, CHECKPOINT_NAME):
        # checked: the checkpoint loads and gives the bits the trials gave (else an mpt bug)
        info = save_checkpoint(model, report.plan, ModelInputs(), stage / CHECKPOINT_NAME, lowered=report.lowered,
                               check=result.inputs is not None, hold=hold)
        digest = info.sha256 or tree_sha256(stage / CHECKPOINT_NAME)  # the check read the file: hashed as it read
    return report.written(info, digest, time.monotonic() - t0)

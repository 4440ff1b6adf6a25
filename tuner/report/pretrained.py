"""`mpt tune hf:DIR --save-pretrained SAVED`: the tuned model as a Hugging Face folder that carries its plan.

SAVED is what `save_pretrained` writes (the model's config.json, generation_config.json where the model
generates, the tokenizer's and processor's files copied from DIR) with the weights as the run's checkpoint
stores them: its model.safetensors, byte for byte, so the parameters the plan lowers are bf16/fp16 and the
rest FP32, under the model's own state-dict names (safetensors metadata `format: pt`, what `from_pretrained`
reads). Beside them lie the run's plan.yaml, whose checkpoint digest is that file's, and the folder's
manifest. So `tuner.load("hf:SAVED")` builds the class from SAVED, loads the checkpoint and attaches the plan
(`tuner.report.checkpoint.load`), and the class's own `from_pretrained(SAVED)` loads the weights, without
the plan: transformers offers no hook that runs a package's code on load without `trust_remote_code`, and it
casts every floating-point weight to one dtype (the config's float32, "auto" included), so the lowered
weights come back as FP32 tensors holding the bf16 values.

SAVED is written into a staging folder beside it and renamed into place, so a failed or interrupted write
leaves nothing half-written; a SAVED that holds anything mpt did not write there (its manifest says what it
wrote, with digests) is never replaced, and one mpt saved is replaced only with `resume` or `overwrite`.
"""
from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tuner.core.errors import ConfigError, OutputError
from tuner.core.fingerprint import sha256_file
from tuner.core.output_files import CHECKPOINT_NAME, MANIFEST_NAME, PLAN_NAME
from tuner.policy.plan import Plan
from tuner.workspace.manifest import Manifest

__all__ = ["check_saved_target", "is_saved_folder", "save_pretrained_folder", "TOKENIZER_FILES"]

# The files of DIR a tokenizer or processor reads (transformers' names); the config and the weights are the
# tuned model's, and whatever else DIR holds (calibration data, a README) is not part of the model.
TOKENIZER_FILES = ("tokenizer*", "vocab*", "merges.txt", "special_tokens_map.json", "added_tokens.json", "*.model",
                   "*.tiktoken", "chat_template.json", "chat_template.jinja", "preprocessor_config.json",
                   "processor_config.json", "video_preprocessor_config.json")
_STAGE_PREFIX = ".mpt-saving-"


def is_saved_folder(folder: Path) -> bool:
    """Whether `folder` is one `save_pretrained_folder` wrote and nobody changed since: its manifest lists every
    file in it, each with the digest mpt wrote, the plan among them."""
    manifest = Manifest(folder)
    names = {p.name for p in folder.iterdir()} - {MANIFEST_NAME}
    return PLAN_NAME in names and names == set(manifest.files) and all(manifest.owns(n) for n in names)


def check_saved_target(saved: Path, out: Path, *, replace: bool) -> None:
    """ConfigError (exit 2) unless SAVED can be written without touching anything mpt did not write: it is
    absent, an empty folder, or (with `replace`: resume or overwrite) a folder mpt saved; and it neither is
    `out` nor lies inside it or around it (the run's own outputs are not a model folder)."""
    here, there = saved.resolve(), out.resolve()
    if here == there or there in here.parents or here in there.parents:
        raise ConfigError(f"`save_pretrained` {saved} and `out` {out} overlap: give the saved model a folder of "
                          "its own, outside the run's output folder")
    if not saved.exists() and not saved.is_symlink():
        return
    if saved.is_symlink() or not saved.is_dir():
        raise ConfigError(f"`save_pretrained` {saved} is a file, not a folder: mpt never replaces it; choose "
                          "another folder")
    if not any(saved.iterdir()):
        return
    if not is_saved_folder(saved):
        raise ConfigError(f"`save_pretrained` {saved} holds files mpt did not write; mpt never replaces or "
                          "deletes them: choose another folder or empty it")
    if not replace:
        raise ConfigError(f"`save_pretrained` {saved} already holds a model mpt saved; pass `overwrite` to "
                          "replace it, or choose another folder")


def save_pretrained_folder(model: Any, source: Path, out: Path, saved: Path, *, replace: bool) -> Path:
    """Write SAVED from the run in `out` (its plan.yaml and model.safetensors) and the tuned `model` (a
    transformers model: its config), with the tokenizer files of `source`; returns SAVED.

    Checked again first (the folder may have changed during the search). OutputError naming SAVED when it
    cannot be written; nothing is left of the attempt then, and a SAVED being replaced is put back."""
    check_saved_target(saved, out, replace=replace)
    try:
        saved.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=_STAGE_PREFIX, dir=saved.parent))
    except OSError as exc:
        raise OutputError(f"cannot write `save_pretrained` {saved}: {exc.strerror or exc}") from None
    try:
        _fill(stage, model, source, out)
        _commit(stage, saved)
    except OSError as exc:
        raise OutputError(f"cannot write `save_pretrained` {saved}: {exc.strerror or exc}; nothing was left "
                          f"there, and the run's outputs in {out} are complete") from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)  # gone once renamed; what is left of a failed write otherwise
    return saved


def _fill(stage: Path, model: Any, source: Path, out: Path) -> None:
    """The folder's files into `stage`, and its manifest last (a folder without one is nobody's to replace)."""
    model.config.save_pretrained(stage)
    generation = getattr(model, "generation_config", None)
    if generation is not None and callable(getattr(model, "can_generate", None)) and model.can_generate():
        generation.save_pretrained(stage)
    for path in sorted(source.iterdir()):
        if path.is_file() and any(fnmatch.fnmatch(path.name, pattern) for pattern in TOKENIZER_FILES):
            shutil.copyfile(path, stage / path.name)
    shutil.copyfile(out / PLAN_NAME, stage / PLAN_NAME)
    digest = _copy_hashed(out / CHECKPOINT_NAME, stage / CHECKPOINT_NAME)
    recorded = Plan.load(stage / PLAN_NAME).checkpoint_sha256
    if recorded and digest != recorded:
        raise OSError(f"{out / CHECKPOINT_NAME} changed since {PLAN_NAME} was written (its sha256 differs)")
    digests = {p.name: digest if p.name == CHECKPOINT_NAME else sha256_file(p) for p in stage.iterdir()}
    Manifest(stage).wrote(digests)
    stage.chmod(0o777 & ~_umask())  # mkdtemp's folder is private; a saved model is an ordinary folder


def _copy_hashed(source: Path, target: Path) -> str:
    """Copy a file, returning its sha256 from the same read (a checkpoint can be gigabytes)."""
    h = hashlib.sha256()
    with open(source, "rb") as src, open(target, "xb") as dst:
        for block in iter(lambda: src.read(1 << 22), b""):
            h.update(block)
            dst.write(block)
        dst.flush()
        os.fsync(dst.fileno())
    return h.hexdigest()


def _commit(stage: Path, saved: Path) -> None:
    """`stage` renamed to `saved`; an existing `saved` (empty, or mpt's) moved aside first and removed after,
    or put back when the rename fails."""
    if not saved.exists():
        os.replace(stage, saved)
        return
    aside = Path(tempfile.mkdtemp(prefix=_STAGE_PREFIX, dir=saved.parent)) / "old"
    os.replace(saved, aside)
    try:
        os.replace(stage, saved)
    except BaseException:
        with contextlib.suppress(OSError):
            os.replace(aside, saved)
        raise
    finally:
        shutil.rmtree(aside.parent, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask

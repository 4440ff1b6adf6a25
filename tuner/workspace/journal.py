"""journal.jsonl: one line per finished evaluation, so `--resume` never repeats one.

The first line is a header holding the run's fingerprint: the user's files,
the FP32 weights, the settings and the versions. `--resume` refuses a journal
whose fingerprint differs and says which part changed. Each line is flushed
and fsynced as soon as its evaluation ends; a torn last line (the process was
killed mid-write) is dropped, and a journal torn inside its header (nothing
after it was ever written) starts over. An evaluation's line also keeps the
states of the random generators it moved (`generators`), which a resumed run
puts back, so it goes on as the interrupted run would have
(tuner.search.repeatable).

Inputs recorded from the model's first forward call (a model file without
`example_inputs()`) are kept beside it in `journal-inputs.safetensors`, so a
resumed run does not evaluate again just to record them.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tuner.core.errors import ConfigError, OutputError
from tuner.core.fileio import atomic_write
from tuner.core.fingerprint import sha256_file
from tuner.core.inputs import ModelInputs
from tuner.core.output_files import INPUTS_NAME
from tuner.core.version import __version__
from tuner.workspace.manifest import Manifest, head_sha256

JOURNAL_FORMAT = 2
# The inputs file's metadata, as JSON: every argument's name in call order, and the non-tensor ones' values.
_NAMES_KEY, _VALUES_KEY = "names", "values"


def versions() -> dict[str, str]:
    return {"mpt": __version__, "torch": torch.__version__.split("+")[0]}


@dataclass(frozen=True)
class RunFingerprint:
    """What a journal's evaluations were measured on."""

    source: str  # tuner.core.fingerprint.source_digest of the user's files
    weights: str  # tuner.core.fingerprint.weights_digest of the FP32 model as built
    settings: Mapping[str, Any] = field(default_factory=dict)
    versions: Mapping[str, str] = field(default_factory=versions)
    files: Mapping[str, str] = field(default_factory=dict)  # file_digests of the same files, model file first

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "weights": self.weights, "settings": dict(self.settings),
                "versions": dict(self.versions), "files": dict(self.files)}

    def _source_changes(self, old: Any) -> list[str]:
        """Which of the user's files changed: the model file, or the files it imports (by name)."""
        names = list(self.files)
        if not isinstance(old, dict) or not names:  # a journal from before files were recorded
            return ["the model file's content changed"]
        found = ["the model file's content changed"] if old.get(names[0]) != self.files[names[0]] else []
        others = [n for n in names[1:] if old.get(n) != self.files[n]] + [n for n in old if n not in self.files]
        if others:
            found.append(f"{', '.join(others)} (imported by the model file) changed")
        return found or ["the model file's content changed"]

    def differences(self, old: Mapping[str, Any]) -> list[str]:
        """What changed since `old` (a header's fingerprint), one whole phrase per part (`--dtype was 'bf16' when
        the journal was written and is 'fp16' now`, as the CLI spells the option)."""
        found = []
        if old.get("source") != self.source:
            found += [f"{c} since the journal was written" for c in self._source_changes(old.get("files"))]
        if old.get("weights") != self.weights:
            found.append("the FP32 weights build_model() returns changed since the journal was written")
        settings = old.get("settings") or {}
        for key in sorted(set(settings) | set(self.settings)):
            if settings.get(key) != self.settings.get(key):
                found.append(f"`{key}` was {_setting(settings, key)} when the journal was written and is "
                             f"{_setting(self.settings, key)} now")
        vers = old.get("versions") or {}
        for key in sorted(set(vers) | set(self.versions)):
            if vers.get(key) != self.versions.get(key):
                found.append(f"the {key} version was {vers.get(key)} when the journal was written and is "
                             f"{self.versions.get(key)} now")
        return found


def _setting(settings: Mapping[str, Any], key: str) -> str:
    """A recorded setting as the refusal shows it; an absent one was not set (its default)."""
    return repr(settings[key]) if key in settings else "not set"


def _number_or_none(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _well_formed(record: Any, *, first: bool) -> bool:
    """A header (first line) or an eval record with the fields the session reads back."""
    if not isinstance(record, dict):
        return False
    if first or record.get("kind") == "header":
        return first and record.get("kind") == "header"
    return (record.get("kind") == "eval" and isinstance(record.get("key"), str)
            and _number_or_none(record.get("metric")) and _number_or_none(record.get("seconds"))
            and record.get("seconds") is not None)


def holds_trials(path: str | Path) -> bool:
    """True when the journal at `path` records a finished evaluation: only then does it hold a run that
    `resume` continues and a new run must not replace unasked. A header alone (a run that failed or was
    stopped before its first trial ended) holds nothing to keep."""
    try:
        with open(path, "rb") as fh:
            fh.readline()  # the header
            for line in fh:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # a torn line: that evaluation did not finish
                if isinstance(record, dict) and record.get("kind") == "eval":
                    return True
    except OSError:
        return False
    return False


class Journal:
    def __init__(self, path: str | Path, fingerprint: RunFingerprint, *, resume: bool) -> None:
        self.path = Path(path)
        self.fingerprint = fingerprint
        self.entries: dict[str, dict[str, Any]] = {}
        if not (resume and self.path.is_file() and self._read()):
            self._start()

    def _start(self) -> None:
        manifest = Manifest(self.path.parent)
        manifest.check_ours([self.path.name, INPUTS_NAME])  # files mpt did not write are never deleted
        manifest.writing(self.path.name)
        for stale in (self.path, self.path.with_name(INPUTS_NAME)):
            stale.unlink(missing_ok=True)
        manifest.forget(INPUTS_NAME)
        self._write_line({"kind": "header", "format": JOURNAL_FORMAT, **self.fingerprint.to_dict()}, mode="w")
        manifest.wrote({self.path.name: head_sha256(self.path)}, head=True)

    def _read(self) -> bool:
        """Load the entries; False when there is nothing to resume (empty, or torn inside the header)."""
        lines = self.path.read_bytes().decode("utf-8", errors="replace").splitlines()
        records = []
        for n, line in enumerate(lines):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if n == len(lines) - 1:
                    break  # torn last line: that evaluation did not finish
                record = None
            if not _well_formed(record, first=n == 0):
                raise ConfigError(f"line {n + 1} is damaged; cannot resume (use `overwrite` to start over)",
                                  source=str(self.path))
            records.append(record)
        if not records:
            return False  # torn inside the header: no evaluation was ever recorded
        header = records[0]
        foreign = header.get("kind") != "header" or header.get("format") != JOURNAL_FORMAT
        changed = [] if foreign else self.fingerprint.differences(header)
        if (foreign or changed) and not any(r.get("kind") == "eval" for r in records[1:]):
            return False  # a header alone (a run stopped before its first trial): nothing to resume, start over
        if foreign:
            raise ConfigError("the journal was written by another version of mpt; cannot resume "
                              "(use `overwrite` to start over)", source=str(self.path))
        if changed:
            raise ConfigError("cannot resume: " + "; ".join(changed) + " (use `overwrite` to start over)",
                              source=str(self.path))
        self.entries = {r["key"]: r for r in records[1:] if r.get("kind") == "eval" and "key" in r}
        if len(records) != len(lines):  # drop the torn line so appends stay valid JSONL
            atomic_write(self.path, lambda tmp: Path(tmp).write_text(
                "".join(json.dumps(r, default=str) + "\n" for r in records), encoding="utf-8"))
            Manifest(self.path.parent).wrote({self.path.name: head_sha256(self.path)}, head=True)
        return True

    def _write_line(self, record: dict[str, Any], *, mode: str = "a") -> None:
        """Append (or, mode "w", start) the journal; OutputError (exit 2) naming it when it cannot be written:
        `out` removed or made read-only during the run, the journal replaced by something else."""
        if mode == "a" and not self.path.is_file():
            gone = "`out` " + str(self.path.parent) if not self.path.parent.is_dir() else "the journal"
            raise OutputError(f"cannot write the journal {self.path}: {gone} was removed or replaced during the "
                              "run; start again (or `resume` once the folder is back)")
        try:
            with open(self.path, mode, encoding="utf-8") as fh:
                fh.write(json.dumps(record, default=str) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            raise OutputError(f"cannot write the journal {self.path}: {exc.strerror or exc}") from None

    def get(self, key: str) -> dict[str, Any] | None:
        return self.entries.get(key)

    def append(self, key: str, record: dict[str, Any]) -> None:
        rec = {"kind": "eval", "key": key, **record}
        self.entries[key] = rec
        self._write_line(rec)

    # --- inputs recorded from the first forward call ------------------------------------------------------
    def save_inputs(self, inputs: ModelInputs | tuple) -> bool:
        """Keep recorded inputs (positional and keyword); False when an argument is neither a tensor nor a
        JSON scalar (None, bool, int, float, str), since safetensors holds tensors only."""
        from safetensors.torch import save_file

        named = ModelInputs.of(inputs).named()
        values = {n: v for n, v in named if not isinstance(v, torch.Tensor)}
        if not all(v is None or isinstance(v, (bool, int, float, str)) for v in values.values()):
            return False
        tensors = {n: v.detach().contiguous().cpu() for n, v in named if isinstance(v, torch.Tensor)}
        meta = {_NAMES_KEY: json.dumps([n for n, _ in named]), _VALUES_KEY: json.dumps(values)}
        manifest = Manifest(self.path.parent)
        manifest.check_ours([INPUTS_NAME])
        manifest.writing(INPUTS_NAME)
        atomic_write(self.path.with_name(INPUTS_NAME), lambda tmp: save_file(tensors, tmp, metadata=meta))
        manifest.wrote({INPUTS_NAME: sha256_file(self.path.with_name(INPUTS_NAME))})
        return True

    def load_inputs(self) -> ModelInputs | None:
        """The inputs save_inputs kept; None when there are none or the file is unreadable (record again)."""
        from safetensors import safe_open

        path = self.path.with_name(INPUTS_NAME)
        if not path.is_file():
            return None
        try:
            with safe_open(str(path), framework="pt") as fh:
                meta = fh.metadata() or {}
                names, values = json.loads(meta[_NAMES_KEY]), json.loads(meta[_VALUES_KEY])
                found = {name: fh.get_tensor(name) for name in fh.keys()} | values
            return ModelInputs.from_flat({name: found[name] for name in names})  # safetensors sorts its keys
        except Exception:  # noqa: BLE001 - unreadable: record the inputs again
            return None

"""`.mpt-manifest.json`: the files mpt wrote into an output folder, so it never replaces or deletes anyone else's.

An output name (`plan.yaml`, `model.safetensors`, the journal, ...) in `out`
belongs to mpt only while the manifest lists it and its content is what mpt
wrote; any other file under that name is the user's, and no flag (`resume`,
`overwrite`) lets mpt replace or delete it: `check_ours` raises ConfigError
(exit 2) naming it. An entry is one of

    {"sha256": "<hex>"}       written whole: mpt's while the file hashes to this
    {"head_sha256": "<hex>"}  append-only (the journal): mpt's while its first line hashes to this
    {"sha256": null}          being written: mpt claimed the free (or its own) name first, so a kill
                              between claiming and recording the digest leaves the file mpt's

`staging` lists the writer's staging folders (made by mpt, empty when
listed): a kill during the output commit leaves one behind, and the next run
that claims the folder removes it. The manifest itself is written atomically.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tuner.core.errors import ConfigError
from tuner.core.fileio import atomic_write_text
from tuner.core.fingerprint import sha256_file, tree_sha256
from tuner.core.output_files import MANIFEST_NAME, STAGING_NAME

_FORMAT = 1


def head_sha256(path: str | Path) -> str:
    """sha256 of a file's first line (without its newline)."""
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.readline().rstrip(b"\n")).hexdigest()


class Manifest:
    """The manifest of one folder, read when made; every change is saved at once."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / MANIFEST_NAME
        self.files: dict[str, dict[str, Any]] = {}
        self.staging: list[str] = []
        self._read()

    def _read(self) -> None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return  # none, or unreadable: mpt owns nothing here
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            return
        files, staging = data.get("files"), data.get("staging")
        if isinstance(files, dict):
            self.files = {n: e for n, e in files.items() if isinstance(n, str) and isinstance(e, dict)}
        if isinstance(staging, list):
            self.staging = [n for n in staging if isinstance(n, str) and n.startswith(STAGING_NAME + "-")
                            and "/" not in n and "\\" not in n]

    def _save(self) -> None:
        text = json.dumps({"format": _FORMAT, "files": self.files, "staging": self.staging}, indent=1,
                          sort_keys=True)
        atomic_write_text(self.path, text + "\n")

    # --- ownership ---------------------------------------------------------------------------------------
    def owns(self, name: str) -> bool:
        """True when `name` in the folder is absent or is the file mpt wrote there."""
        path = self.folder / name
        if not path.exists() and not path.is_symlink():
            return True
        entry = self.files.get(name)
        if entry is None or path.is_symlink() or not (path.is_file() or path.is_dir()):
            return False
        if "head_sha256" in entry:
            return path.is_file() and bool(head_sha256(path) == entry["head_sha256"])
        return entry.get("sha256") is None or bool(tree_sha256(path) == entry["sha256"])

    def check_ours(self, names: Iterable[str]) -> None:
        """ConfigError (exit 2) naming every file among `names` that mpt did not write, or wrote and that
        changed since (told apart: an edited report.md is not "a file mpt did not write"); mpt never touches
        those."""
        foreign = [n for n in names if not self.owns(n)]
        edited = [n for n in foreign if n in self.files]  # mpt wrote it, someone changed it since
        theirs = [n for n in foreign if n not in self.files]
        if theirs:
            listed = ", ".join(str(self.folder / n) for n in theirs)
            raise ConfigError(f"`out` {self.folder} holds {listed}, which mpt did not write; mpt never replaces "
                              "or deletes it, whatever the options: move it out of the folder or choose another "
                              "`out`")
        if edited:
            listed = ", ".join(str(self.folder / n) for n in edited)
            raise ConfigError(f"`out` {self.folder} holds {listed}, which mpt wrote but which changed since; mpt "
                              "never replaces or deletes an edited file, whatever the options: keep your version "
                              "elsewhere and delete it (or move it out of the folder), or choose another `out`")

    # --- recording -----------------------------------------------------------------------------------------
    def writing(self, *names: str) -> None:
        """Claim `names` before writing them (the caller has made sure they are free or mpt's: check_ours)."""
        self.files.update({n: {"sha256": None} for n in names})
        self._save()

    def wrote(self, digests: Mapping[str, str], *, head: bool = False) -> None:
        """Record what mpt wrote: name -> sha256 of the whole file (or of its first line: `head`)."""
        key = "head_sha256" if head else "sha256"
        self.files.update({n: {key: d} for n, d in digests.items()})
        self._save()

    def forget(self, *names: str) -> None:
        """`names` are gone (mpt deleted them)."""
        if any(n in self.files for n in names):
            for n in names:
                self.files.pop(n, None)
            self._save()

    def write_own(self, name: str, text: str) -> bool:
        """Write `text` to `name` and record it, unless a file mpt did not write is there (left as it is).

        For mpt's own small files (the folder's .gitignore); True when written.
        """
        if not self.owns(name):
            return False
        self.writing(name)
        atomic_write_text(self.folder / name, text)
        self.wrote({name: sha256_file(self.folder / name)})
        return True

    def remove(self, name: str) -> None:
        """Delete mpt's own `name` (a file, or a folder such as a sharded checkpoint) and forget it."""
        path = self.folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
        self.forget(name)

    # --- staging folders ------------------------------------------------------------------------------
    def add_staging(self, name: str) -> None:
        self.staging.append(name)
        self._save()

    def drop_staging(self, name: str) -> None:
        if name in self.staging:
            self.staging.remove(name)
            self._save()

    def clean_staging(self) -> list[str]:
        """Remove the staging folders a killed run left (those listed); returns their names."""
        removed = []
        for name in list(self.staging):
            path = self.folder / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            if not path.exists():
                removed.append(name)
                self.staging.remove(name)
        if removed:
            self._save()
        return removed

"""The output folder of one tune run: created, checked, and locked against a second run.

Files under mpt's output names that mpt did not write (tuner.workspace.manifest)
are never replaced or deleted: claiming such a folder is refused, whatever the
flags.

The lock is `fcntl.flock` on `.mpt.lock` inside the folder: the kernel drops
it when the holding process ends, however it ends, so a killed run never
leaves a lock that blocks later runs. The file holds the holder's pid and
start time for the message a refused run prints. Where `fcntl` is missing
(Windows), an exclusive create with a pid liveness check stands in.

A run that ends (fails, or is stopped) before its first trial is recorded in
the journal leaves nothing behind: `discard_unused` removes what mpt wrote for
it (the journal's header, the folder's .gitignore, manifest and lock, the
folder when the claim made it), so the corrected rerun is not refused. A
journal with no trial is not "a run" either (a killed process cannot clean up).
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tuner.core.errors import ConfigError, OutputFolderBusy
from tuner.core.output_files import (
    COMMITTED,
    GITIGNORE_NAME,
    GITIGNORE_TEXT,
    INPUTS_NAME,
    JOURNAL_NAME,
    LOCK_NAME,
    REFERENCE_NAME,
)
from tuner.workspace.journal import holds_trials
from tuner.workspace.manifest import Manifest

# What a run writes before its first trial is recorded: nothing in them is worth keeping without a trial.
_BEFORE_FIRST_TRIAL = (JOURNAL_NAME, INPUTS_NAME, REFERENCE_NAME)

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


class OutputFolder:
    """`with OutputFolder.claim(path, ...) as folder:` holds the lock until the block ends."""

    def __init__(self, path: Path, fd: int, *, made: bool = False) -> None:
        self.path = path
        self._fd = fd
        self._made = made  # the claim created the folder: it goes again if nothing is left in it

    @classmethod
    def claim(cls, path: str | Path, *, resume: bool, overwrite: bool, outputs: Iterable[str]) -> OutputFolder:
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise ConfigError(f"`out` {path} is a file, not a folder")
        made = not path.exists()
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create `out` {path}: {exc.strerror}") from None
        locked = (path / LOCK_NAME).exists()  # a lock file an earlier run left: mpt's, it stays
        folder = cls(path, cls._lock(path), made=made)
        try:
            folder._check(resume=resume, overwrite=overwrite, outputs=tuple(outputs))
        except BaseException:
            folder._refused(keep_lock=locked)
            raise
        return folder

    def _refused(self, *, keep_lock: bool) -> None:
        """A refused claim leaves the folder as it found it: the lock file it made goes (a user's folder keeps
        no .mpt.lock), and so does the folder when the claim made it."""
        with contextlib.suppress(OSError):
            if not keep_lock:
                (self.path / LOCK_NAME).unlink(missing_ok=True)  # the lock itself stays held until release()
            if self._made and not any(self.path.iterdir()):
                self.path.rmdir()
        self.release()

    @staticmethod
    def _lock(path: Path) -> int:
        lock = path / LOCK_NAME
        try:
            if fcntl is not None:
                fd = _flock(lock, path)
            else:  # pragma: no cover - Windows
                fd = _exclusive_create(lock, path)
        except OSError as exc:
            raise ConfigError(f"`out` {path} is not writable: {exc.strerror}") from None
        stamp = _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S")
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, f"pid {os.getpid()}, started {stamp}\n".encode())
        return fd

    def _check(self, *, resume: bool, overwrite: bool, outputs: tuple[str, ...]) -> None:
        """Refuse a folder holding files under mpt's names that mpt did not write (whatever the flags), or
        holding a run without `resume`/`overwrite`; remove the staging folders a killed run left; write the
        folder's .gitignore (tuner.core.output_files.NOT_FOR_GIT) unless the user keeps one of their own there."""
        manifest = Manifest(self.path)
        manifest.clean_staging()
        manifest.check_ours(outputs)
        present = [n for n in outputs if (self.path / n).exists()]
        unused = () if holds_trials(self.path / JOURNAL_NAME) else _BEFORE_FIRST_TRIAL
        held = [n for n in present if n not in unused]  # a journal without a trial holds no run
        if held and not (resume or overwrite):
            raise ConfigError(f"`out` {self.path} already holds a run ({', '.join(held[:3])}); "
                              "pass `resume` to continue it or `overwrite` to replace it")
        if overwrite and not resume:
            for n in present:
                manifest.remove(n)
        with contextlib.suppress(OSError):  # advice for git, not an output: a run does not fail for it
            manifest.write_own(GITIGNORE_NAME, GITIGNORE_TEXT)

    def discard_unused(self) -> None:
        """Remove what mpt wrote for a run that recorded no trial, so it never refuses the next run.

        Nothing happens once the journal holds a trial (`resume` continues from it), and only files the
        manifest says are mpt's are removed. The folder's .gitignore, manifest and lock go too when no
        output of a finished run is left, and the folder itself when the claim made it and it is empty."""
        if self._fd < 0 or holds_trials(self.path / JOURNAL_NAME):
            return
        with contextlib.suppress(OSError):
            manifest = Manifest(self.path)
            if any((self.path / n).exists() for n in COMMITTED) or manifest.staging:
                return  # a finished run's outputs (its journal removed by hand): not this run's to remove
            for name in (*_BEFORE_FIRST_TRIAL, GITIGNORE_NAME):
                if name in manifest.files and manifest.owns(name):
                    manifest.remove(name)
            if manifest.files:
                return  # something else of mpt's (a file being written by a killed run): keep its record
            manifest.path.unlink(missing_ok=True)
            (self.path / LOCK_NAME).unlink(missing_ok=True)  # the lock itself stays held until release()
            if self._made and not any(self.path.iterdir()):
                self.path.rmdir()

    def release(self) -> None:
        if self._fd < 0:
            return
        if fcntl is None:  # pragma: no cover - Windows
            (self.path / LOCK_NAME).unlink(missing_ok=True)
        os.close(self._fd)  # closing drops the flock
        self._fd = -1

    def __enter__(self) -> OutputFolder:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: Any) -> None:
        if kind is not None:  # failed or interrupted: a run with no trial leaves nothing behind
            self.discard_unused()
        self.release()


def _flock(lock: Path, path: Path) -> int:
    """An open, exclusively flocked `lock`; OutputFolderBusy when another run holds it.

    A run that recorded no trial deletes its lock file (discard_unused): a run that opened the file before
    then holds a lock on a file no longer in the folder, so it checks that the file it locked is still the
    folder's and, if not, locks the folder's (new) file instead."""
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode("utf-8", "replace").strip()
            os.close(fd)
            raise OutputFolderBusy(f"`out` {path} is in use by another mpt run ({holder or 'pid unknown'}); "
                                   "wait for it to finish or use another `out`") from None
        try:
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # the file was removed after we opened it: lock the one there now


def _exclusive_create(lock: Path, path: Path) -> int:  # pragma: no cover - Windows
    for _ in range(2):
        try:
            return os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            text = lock.read_text(encoding="utf-8", errors="replace")
            pid = int(text.split()[1].rstrip(",")) if text.startswith("pid ") else -1
            if pid > 0 and _pid_alive(pid):
                raise OutputFolderBusy(f"`out` {path} is in use by another mpt run ({text.strip()})") from None
            lock.unlink(missing_ok=True)  # stale: its run is gone
    raise OutputFolderBusy(f"`out` {path} is in use by another mpt run")

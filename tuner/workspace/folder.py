"""The output folder of one tune run: created, checked, and locked against a second run.

Files under mpt's output names that mpt did not write (tuner.workspace.manifest)
are never replaced or deleted: claiming such a folder is refused, whatever the
flags.

The lock is `fcntl.flock` on `.mpt.lock` inside the folder: the kernel drops
it when the holding process ends, however it ends, so a killed run never
leaves a lock that blocks later runs. The file holds the holder's pid and
start time for the message a refused run prints. Where `fcntl` is missing
(Windows), an exclusive create with a pid liveness check stands in.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tuner.core.errors import ConfigError, OutputFolderBusy
from tuner.core.output_files import GITIGNORE_NAME, GITIGNORE_TEXT, LOCK_NAME
from tuner.workspace.manifest import Manifest

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

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd

    @classmethod
    def claim(cls, path: str | Path, *, resume: bool, overwrite: bool, outputs: Iterable[str]) -> OutputFolder:
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise ConfigError(f"`out` {path} is a file, not a folder")
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create `out` {path}: {exc.strerror}") from None
        folder = cls(path, cls._lock(path))
        try:
            folder._check(resume=resume, overwrite=overwrite, outputs=tuple(outputs))
        except BaseException:
            folder.release()
            raise
        return folder

    @staticmethod
    def _lock(path: Path) -> int:
        lock = path / LOCK_NAME
        try:
            if fcntl is not None:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = os.read(fd, 200).decode("utf-8", "replace").strip()
                    os.close(fd)
                    raise OutputFolderBusy(f"`out` {path} is in use by another mpt run ({holder or 'pid unknown'}); "
                                           "wait for it to finish or use another `out`") from None
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
        held = [n for n in outputs if (self.path / n).exists()]
        if held and not (resume or overwrite):
            raise ConfigError(f"`out` {self.path} already holds a run ({', '.join(held[:3])}); "
                              "pass `resume` to continue it or `overwrite` to replace it")
        if overwrite and not resume:
            for n in held:
                manifest.remove(n)
        with contextlib.suppress(OSError):  # advice for git, not an output: a run does not fail for it
            manifest.write_own(GITIGNORE_NAME, GITIGNORE_TEXT)

    def release(self) -> None:
        if self._fd < 0:
            return
        if fcntl is None:  # pragma: no cover - Windows
            (self.path / LOCK_NAME).unlink(missing_ok=True)
        os.close(self._fd)  # closing drops the flock
        self._fd = -1

    def __enter__(self) -> OutputFolder:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


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

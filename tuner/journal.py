"""journal.jsonl: one line per finished evaluation, so `--resume` never repeats one.

Each line is flushed and fsynced as soon as the evaluation ends; a torn last
line (the process was killed mid-write) is ignored on reading.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .errors import ConfigError

JOURNAL_NAME = "journal.jsonl"


class Journal:
    def __init__(self, path: str | Path, header: dict[str, Any], *, resume: bool) -> None:
        self.path = Path(path)
        self.header = header
        self.entries: dict[str, dict[str, Any]] = {}
        if resume and self.path.is_file():
            self._read()
        else:
            with open(self.path, "w", encoding="utf-8") as fh:
                fh.write(json.dumps({"kind": "header", **header}) + "\n")
                fh.flush()
                os.fsync(fh.fileno())

    def _read(self) -> None:
        lines = self.path.read_text(encoding="utf-8").splitlines()
        good: list[str] = []
        for n, line in enumerate(lines):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                if n == len(lines) - 1:
                    break  # torn last line
                raise ConfigError(f"journal line {n + 1} is not JSON; cannot resume", source=str(self.path)) from None
            good.append(line)
            if rec.get("kind") == "header":
                mismatch = {k: (rec.get(k), v) for k, v in self.header.items()
                            if k in rec and rec.get(k) != v and k not in ("started",)}
                if mismatch:
                    detail = ", ".join(f"{k}: journal {a!r} vs now {b!r}" for k, (a, b) in mismatch.items())
                    raise ConfigError(f"cannot resume: the journal was written with other settings ({detail}); "
                                      "use --overwrite to start over", source=str(self.path))
            elif rec.get("kind") == "eval":
                self.entries[rec["key"]] = rec
        if len(good) != len(lines):  # drop the torn line so appends stay valid JSONL
            with open(self.path, "w", encoding="utf-8") as fh:
                fh.write("\n".join(good) + "\n")

    def get(self, key: str) -> dict[str, Any] | None:
        return self.entries.get(key)

    def append(self, key: str, record: dict[str, Any]) -> None:
        rec = {"kind": "eval", "key": key, **record}
        self.entries[key] = rec
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(rec, default=str) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

"""The one place mpt reads YAML (plans, configs, presets, op lists): safe loading, no aliases, key checks.

Aliases are refused because none of these files needs them and an alias bomb
(anchors repeating each other) expands to gigabytes; refusing the first alias
costs nothing. A UTF-8 byte-order mark (Windows editors write one) is accepted.

The files are bounded before they are parsed: one larger than `MAX_FILE_BYTES`
(far above any plan, config or op list mpt writes or reads) is refused from its
size alone, and a YAML document nested deeper than `MAX_DEPTH` levels is refused
at the first node past it (the composer recurses per level: a deep document
would otherwise end in RecursionError).
"""
from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from tuner.core.errors import ConfigError

MAX_FILE_BYTES = 4 << 20  # 4 MiB: a plan with 10,000 FP32 op instances is under 1 MiB
MAX_DEPTH = 16  # mapping/sequence levels; a plan has 3 (fp32_instances -> item -> value)


class _AliasRefused(yaml.YAMLError):
    def __init__(self, anchor: str, mark: Any) -> None:
        super().__init__(anchor)
        self.anchor = anchor
        self.mark = mark


class _TooDeep(yaml.YAMLError):
    def __init__(self, mark: Any) -> None:
        super().__init__("too deep")
        self.mark = mark


class _Loader(yaml.SafeLoader):
    """SafeLoader that stops at the first alias (`*name`), before anything is expanded, and at the first
    node nested deeper than MAX_DEPTH."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _AliasRefused(event.anchor, event.start_mark)
        if self._depth >= MAX_DEPTH:
            raise _TooDeep(self.peek_event().start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def check_keys(data: dict[str, Any], allowed: Iterable[str], *, where: str) -> list[str]:
    """One problem per unknown key, each suggesting the nearest allowed key."""
    allowed = sorted(allowed)
    problems = []
    for key in data:
        if key not in allowed:
            near = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else f"; valid keys: {', '.join(allowed)}"
            problems.append(f"{where}{key}: unknown key{hint}")
    return problems


def read_text_file(path: str | Path) -> str:
    """A UTF-8 text file's content, without a leading byte-order mark; ConfigError when it is not text
    or larger than MAX_FILE_BYTES (refused from its size, before it is read)."""
    try:
        size = Path(path).stat().st_size
        if size > MAX_FILE_BYTES:
            raise ConfigError(f"{size / (1 << 20):.1f} MB is larger than mpt reads in a plan, config or op list "
                              f"({MAX_FILE_BYTES >> 20} MB at most); is this the right file?", source=str(path))
        with open(path, encoding="utf-8-sig") as fh:
            text = fh.read(MAX_FILE_BYTES + 1)  # a file that grew since stat() is refused all the same
        if len(text.encode("utf-8")) > MAX_FILE_BYTES:
            raise ConfigError(f"larger than mpt reads in a plan, config or op list ({MAX_FILE_BYTES >> 20} MB "
                              "at most); is this the right file?", source=str(path))
        return text
    except UnicodeDecodeError:
        raise ConfigError("not a UTF-8 text file", source=str(path)) from None
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", source=str(path)) from None


def load_yaml_file(path: str | Path) -> Any:
    """Parse a YAML file with the safe loader; every failure is a one-line ConfigError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"file not found: {path}")
    text = read_text_file(path)
    try:
        return yaml.load(text, Loader=_Loader)  # _Loader is a SafeLoader that also refuses aliases
    except _AliasRefused as exc:
        raise ConfigError(f"YAML aliases (*{exc.anchor}) are not supported{_at(exc.mark)}",
                          source=str(path)) from None
    except _TooDeep as exc:
        raise ConfigError(f"nested more than {MAX_DEPTH} levels deep{_at(exc.mark)}; no plan, config or op list "
                          "is", source=str(path)) from None
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"malformed YAML{_at(getattr(exc, 'problem_mark', None))}: {problem}",
                          source=str(path)) from None


def _at(mark: Any) -> str:
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""

"""The one place mpt reads YAML (plans, configs, presets, op lists): safe loading, no aliases, key checks.

Aliases are refused because none of these files needs them and an alias bomb
(anchors repeating each other) expands to gigabytes; refusing the first alias
costs nothing. A UTF-8 byte-order mark (Windows editors write one) is accepted.
"""
from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from tuner.core.errors import ConfigError


class _AliasRefused(yaml.YAMLError):
    def __init__(self, anchor: str, mark: Any) -> None:
        super().__init__(anchor)
        self.anchor = anchor
        self.mark = mark


class _Loader(yaml.SafeLoader):
    """SafeLoader that stops at the first alias (`*name`), before anything is expanded."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _AliasRefused(event.anchor, event.start_mark)
        return super().compose_node(parent, index)


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
    """A UTF-8 text file's content, without a leading byte-order mark; ConfigError when it is not text."""
    try:
        return Path(path).read_text(encoding="utf-8-sig")
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
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"malformed YAML{_at(getattr(exc, 'problem_mark', None))}: {problem}",
                          source=str(path)) from None


def _at(mark: Any) -> str:
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""

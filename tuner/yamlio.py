"""YAML helpers: safe loading and key checks with near-match suggestions."""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Iterable

import yaml

from .errors import ConfigError


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


def load_yaml_file(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"file not found: {path}")
    try:
        with open(path, encoding="utf-8") as fh:
            return yaml.safe_load(fh)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        loc = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"malformed YAML{loc}: {problem}", source=str(path)) from None
    except UnicodeDecodeError:
        raise ConfigError("not a text file", source=str(path)) from None

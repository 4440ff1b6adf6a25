"""YAML config files for `mpt tune`, `mpt inspect` and `mpt check`, and the checks their options share.

A config's keys are the commands' long option names with underscores
(`max_evals`, `lower_is_better`), plus `version: 1`; `model` is the model
file, as everywhere. One file can serve every command: each takes the keys it
uses and ignores the others, so a pipeline can run `mpt tune --config X` and
then `mpt check --config X`. Keys no command knows are errors.

The schema (a `Key` per config key) is not written here: the CLI derives it
from its click options (cli/options.py), so a key and its flag cannot drift
apart. This module owns the decisions: `validate_config` checks a parsed file
and `check_options` checks values given on the command line by the same
rules, so both report the same problem in the same words. Every problem is
reported at once in a ConfigError whose `fields` name the keys involved.
"""
from __future__ import annotations

import difflib
import math
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.core.errors import ConfigError
from tuner.core.yamlio import load_yaml_file

__all__ = ["CONFIG_VERSION", "KINDS", "Key", "Schema", "load_config", "validate_config", "check_options",
           "tolerance_problem"]

CONFIG_VERSION = 1

# model-file: MODEL.py[:build_fn]; function: NAME or FILE.py:NAME; modules: {PATH: DTYPE} or ['PATH=DTYPE'].
KINDS = ("str", "path", "model-file", "function", "bool", "int", "number", "choice", "preset", "modules")

_KIND_WORDS = {
    "str": "a string", "path": "a path (string)", "model-file": "a path (string)", "function": "a string",
    "bool": "true or false", "int": "an integer", "number": "a number", "choice": "one of",
    "preset": "a preset name", "modules": "a mapping of module path to dtype, or a list of 'PATH=DTYPE' strings",
}


@dataclass(frozen=True)
class Key:
    """One config key: the kind of value it takes, the commands that use it, and its help."""

    kind: str
    commands: frozenset[str]
    help: str = ""
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    exclusive_min: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown config key kind {self.kind!r}; expected one of {', '.join(KINDS)}")
        if (self.kind == "choice") != bool(self.choices):
            raise ValueError("a choice key needs choices, and only a choice key has them")


Schema = Mapping[str, Key]


def _found(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, (dict, list, tuple)):
        return f"a {'mapping' if isinstance(value, dict) else 'list'}"
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return f"{shown} ({type(value).__name__})"


def _check_value(name: str, key: Key, value: Any) -> tuple[Any, str | None]:
    """(the value, normalised; or None and the problem)."""
    expected = _KIND_WORDS[key.kind]
    if key.kind in ("str", "path", "model-file", "function", "preset"):
        if not isinstance(value, str) or not value.strip():
            return None, f"{name}: expected {expected}, found {_found(value)}"
        value = value.strip()
        if key.kind == "preset":
            from tuner.policy.presets import load_preset

            try:
                load_preset(value)
            except ConfigError as exc:
                return None, f"{name}: {exc.errors[0]}"
        return value, None
    if key.kind == "bool":
        if not isinstance(value, bool):
            return None, f"{name}: expected {expected}, found {_found(value)}"
        return value, None
    if key.kind in ("int", "number"):
        ok = isinstance(value, int) if key.kind == "int" else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok or (isinstance(value, float) and not math.isfinite(value)):
            return None, f"{name}: expected {expected}, found {_found(value)}"
        if key.minimum is not None and (value <= key.minimum if key.exclusive_min else value < key.minimum):
            rel = ">" if key.exclusive_min else ">="
            return None, f"{name}: expected {expected} {rel} {key.minimum:g}, found {value!r}"
        return value, None
    if key.kind == "choice":
        if not isinstance(value, str) or value.strip().lower() not in key.choices:
            near = difflib.get_close_matches(str(value).lower(), key.choices, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            return None, f"{name}: expected one of {', '.join(key.choices)}, found {_found(value)}{hint}"
        return value.strip().lower(), None
    return _check_modules(name, value)


def _check_modules(name: str, value: Any) -> tuple[Any, str | None]:
    """Per-module overrides as ['PATH=DTYPE', ...] (the command line's form), from a mapping or such a list."""
    if isinstance(value, dict):
        pairs = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) and "=" in v for v in value):
        pairs = [(v.split("=", 1)[0].strip(), v.split("=", 1)[1].strip()) for v in value]
    else:
        return None, f"{name}: expected {_KIND_WORDS['modules']}, found {_found(value)}"
    from tuner.core.dtypes import parse_dtype

    for path, dtype in pairs:
        try:
            parse_dtype(dtype)
        except ValueError as exc:
            return None, f"{name}.{path}: {exc}"
    return [f"{path}={dtype}" for path, dtype in pairs], None


def tolerance_problem(tolerance: float, absolute: bool) -> str | None:
    """Why a tolerance cannot be used (None when it can): a relative one must lie in [0, 1)."""
    if tolerance < 0:
        return f"tolerance: expected a number >= 0, found {tolerance!r}"
    if not absolute and tolerance >= 1:
        return f"tolerance: a relative tolerance must be below 1 (0.01 = 1%), found {tolerance!r}"
    return None


def _cross_problems(values: Mapping[str, Any], keys: Collection[str]) -> list[tuple[str, str]]:
    """Rules over several options: (fields, problem) pairs."""
    problems: list[tuple[str, str]] = []
    tol = values.get("tolerance")
    if "absolute" in keys and isinstance(tol, (int, float)) and not isinstance(tol, bool) and tol >= 0:
        problem = tolerance_problem(tol, bool(values.get("absolute", False)))
        if problem:
            problems.append(("tolerance", problem + "; set `absolute` for an absolute drop"))
    if values.get("resume") and values.get("overwrite"):
        problems.append(("resume and overwrite", "resume and overwrite: give one of them, not both"))
    return problems


def _unknown(key: Any, schema: Schema) -> str:
    text = str(key)
    known = ["version", *schema]
    underscored = text.replace("-", "_")
    if underscored in known and underscored != text:
        return f"{text}: unknown key; config keys use underscores: write {underscored!r}"
    near = difflib.get_close_matches(underscored, known, n=2, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else \
        f"; valid keys: {', '.join(sorted(known))}"
    return f"{text}: unknown key{hint}"


def _version_problem(data: Mapping[Any, Any]) -> str | None:
    if "version" not in data:
        return f"version: missing; a config starts with `version: {CONFIG_VERSION}`"
    version = data["version"]
    if isinstance(version, bool) or not isinstance(version, int):
        return f"version: expected an integer, found {_found(version)}"
    if version > CONFIG_VERSION:
        return f"version: config version {version} is newer than this mpt reads ({CONFIG_VERSION}); upgrade mpt-tuner"
    if version != CONFIG_VERSION:
        return f"version: expected {CONFIG_VERSION}, found {version}"
    return None


def _resolve(base: Path, text: str) -> str:
    """A path from the config, relative to the config file's folder (absolute and ~ paths as they are)."""
    path = os.path.expanduser(text)
    if os.path.isabs(path):
        return path
    return os.path.normpath(os.path.join(str(base), path))


def _resolve_paths(values: dict[str, Any], schema: Schema, base: Path) -> dict[str, Any]:
    """Paths and the file part of FILE.py:NAME specs made relative to `base`; bare function names stay."""
    resolved = dict(values)
    for name, value in values.items():
        kind = schema[name].kind
        if kind == "path":
            resolved[name] = _resolve(base, value)
        elif kind in ("model-file", "function"):
            head, sep, tail = value.rpartition(":")
            if sep and head and tail.isidentifier() and (kind == "model-file" or head.lower().endswith(".py")):
                resolved[name] = f"{_resolve(base, head)}:{tail}"
            elif kind == "model-file" or value.lower().endswith(".py"):
                resolved[name] = _resolve(base, value)
    return resolved


def validate_config(data: Any, schema: Schema, *, base: str | Path = ".", source: str | None = None,
                    command: str | None = None) -> dict[str, Any]:
    """Check a parsed config against `schema`; returns {key: value} for `command` (all keys when None).

    `version: 1` is required, then dropped. Paths are made relative to
    `base`. Raises ConfigError listing every problem.
    """
    if data is None:
        raise ConfigError("the config is empty; expected a mapping such as `version: 1` and `model: model.py`",
                          source=source)
    if not isinstance(data, dict):
        raise ConfigError(f"a config is a YAML mapping of option names to values, found {_found(data)}",
                          source=source)
    problems: list[tuple[str, str]] = []
    version = _version_problem(data)
    if version:
        problems.append(("version", version))
    values: dict[str, Any] = {}
    for name, value in data.items():
        if name == "version":
            continue
        key = schema.get(name) if isinstance(name, str) else None
        if key is None:
            problems.append((str(name), _unknown(name, schema)))
            continue
        converted, problem = _check_value(name, key, value)
        if problem:
            problems.append((name, problem))
        else:
            values[name] = converted
    problems += _cross_problems(values, schema)
    if problems:
        raise ConfigError([p for _, p in problems], source=source, fields=[f for f, _ in problems])
    values = _resolve_paths(values, schema, Path(base))
    if command is not None:
        values = {k: v for k, v in values.items() if command in schema[k].commands}
    return values


def load_config(path: str | Path, schema: Schema, *, command: str | None = None) -> dict[str, Any]:
    """Read a YAML config (yaml.safe_load only) and validate it; paths become relative to its folder.

    Returns {key: value} with the keys `command` uses (every key when None).
    """
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config {path} is a folder, expected a YAML file")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    data = load_yaml_file(path)
    return validate_config(data, schema, base=path.parent, source=str(path), command=command)


def check_options(values: Mapping[str, Any], schema: Schema, *, given: Collection[str] | None = None) -> None:
    """Check option values by the rules a config file obeys: those in `given` (all when None) one by one,
    then the rules over several options on all of them. Raises ConfigError naming the fields.

    For values that did not come from a file (the command line, a caller): paths are left as they are.
    """
    problems: list[tuple[str, str]] = []
    for name, value in values.items():
        if (given is None or name in given) and value is not None and value != ():
            _, problem = _check_value(name, schema[name], value)
            if problem:
                problems.append((name, problem))
    problems += _cross_problems(values, schema)
    if problems:
        raise ConfigError([p for _, p in problems], fields=[f for f, _ in problems])

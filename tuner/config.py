"""YAML config files for `mpt tune`, `mpt inspect` and `mpt check`.

A config's keys are the commands' long option names with underscores
(`max_evals`, `lower_is_better`), plus `version: 1`; `model` is the model file
(MODEL.py[:build_fn]) and `out` the output folder (the folder `mpt check`
reads). One file can serve all three commands: each command takes the keys it
uses and ignores the others, so a pipeline can run `mpt tune --config X` and
then `mpt check --config X`. Keys no command knows are errors.

`load_config` reads with `yaml.safe_load` only, checks every key and reports
all problems at once (a ConfigError listing each key, what was expected and
what was found, with a near-match suggestion for unknown keys), and resolves
paths relative to the config file's folder. The CLI puts the result into
click's `default_map`, so precedence is defaults < config < command line.
"""
from __future__ import annotations

import difflib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .yamlio import load_yaml_file

__all__ = ["CONFIG_VERSION", "KEYS", "DTYPE_CHOICES", "load_config", "validate_config"]

CONFIG_VERSION = 1
DTYPE_CHOICES = ("bf16", "fp16", "bfloat16", "float16", "half")
DEVICE_CHOICES = ("cpu", "cuda")

TUNE, INSPECT, CHECK = "tune", "inspect", "check"
ALL = frozenset({TUNE, INSPECT, CHECK})


@dataclass(frozen=True)
class Key:
    """One config key: its kind, the commands that use it, and what `--help` calls it."""

    kind: str  # str | path | spec | bool | int | number | choice | modules
    commands: frozenset[str]
    help: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    exclusive_min: bool = False


KEYS: dict[str, Key] = {
    "version": Key("int", ALL, "config format version; must be 1"),
    "model": Key("spec", ALL, "model file, MODEL.py or MODEL.py:build_fn"),
    "eval": Key("spec", ALL, "metric function name, or FILE.py:NAME"),
    "inputs": Key("spec", ALL, "example-inputs function name, or FILE.py:NAME"),
    "dtype": Key("choice", frozenset({TUNE, INSPECT}), "lower precision", DTYPE_CHOICES),
    "preset": Key("preset", frozenset({TUNE, INSPECT}), "op-list preset name (see `mpt presets`)"),
    "tolerance": Key("number", frozenset({TUNE}), "allowed loss: relative (0.01 = 1%) unless absolute", minimum=0),
    "absolute": Key("bool", frozenset({TUNE}), "tolerance is an absolute drop"),
    "lower_is_better": Key("bool", frozenset({TUNE}), "the metric is a loss"),
    "max_evals": Key("int", frozenset({TUNE}), "stop after N full evaluations", minimum=2),
    "time_budget": Key("number", frozenset({TUNE}), "seconds", minimum=0, exclusive_min=True),
    "out": Key("path", frozenset({TUNE, CHECK}), "output folder (the folder `mpt check` reads)"),
    "resume": Key("bool", frozenset({TUNE}), "continue the run in out"),
    "overwrite": Key("bool", frozenset({TUNE}), "replace a previous run in out"),
    "device": Key("choice", frozenset({TUNE, CHECK}), "device", DEVICE_CHOICES),
    "thorough": Key("bool", frozenset({TUNE}), "prove every FP32 instance necessary"),
    "rank": Key("choice", frozenset({TUNE}), "how to rank op instances", ("gradient", "exact")),
    "quiet": Key("bool", frozenset({TUNE}), "only the final verdict"),
    "plan": Key("path", frozenset({INSPECT}), "plan.yaml or tune output folder to apply"),
    "module": Key("modules", frozenset({INSPECT}), "per-module overrides: {PATH: DTYPE} or ['PATH=DTYPE']"),
    "lower_list": Key("path", frozenset({INSPECT}), "op-list file replacing the preset's lower-precision list"),
    "fp32_list": Key("path", frozenset({INSPECT}), "op-list file replacing the preset's FP32 list"),
    "top": Key("int", frozenset({INSPECT}), "show only the N calls with the largest error", minimum=1),
    "json": Key("bool", frozenset({INSPECT, CHECK}), "print JSON"),
    "junit": Key("path", frozenset({CHECK}), "write a JUnit XML report to this file"),
    "checkpoint": Key("bool", frozenset({CHECK}), "check the stored model.safetensors, not fresh weights"),
}

_KIND_WORDS = {
    "str": "a string", "path": "a path (string)", "spec": "a string", "bool": "true or false",
    "int": "an integer", "number": "a number", "choice": "one of", "preset": "a preset name",
    "modules": "a mapping of module path to dtype, or a list of 'PATH=DTYPE' strings",
}


def _found(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, (dict, list)):
        return f"a {'mapping' if isinstance(value, dict) else 'list'}"
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return f"{shown} ({type(value).__name__})"


def _resolve(base: Path, text: str) -> str:
    """A path from the config, relative to the config file's folder (absolute and ~ paths as they are)."""
    path = os.path.expanduser(text)
    if os.path.isabs(path):
        return path
    return os.path.normpath(os.path.join(str(base), path))


def _resolve_spec(base: Path, text: str, *, is_file: bool) -> str:
    """`file.py[:name]` gets its file part resolved; a bare function name (eval, inputs) stays as it is."""
    head, sep, tail = text.rpartition(":")
    if sep and head and tail.isidentifier() and (is_file or head.lower().endswith(".py")):
        return f"{_resolve(base, head)}:{tail}"
    if is_file or text.lower().endswith(".py"):
        return _resolve(base, text)
    return text


def _check_value(name: str, key: Key, value: Any, base: Path) -> tuple[Any, str | None]:
    """(converted value, problem or None)."""
    expected = _KIND_WORDS[key.kind]
    if key.kind in ("str", "path", "spec", "preset"):
        if not isinstance(value, str) or not value.strip():
            return None, f"{name}: expected {expected}, found {_found(value)}"
        value = value.strip()
        if key.kind == "path":
            return _resolve(base, value), None
        if key.kind == "spec":
            return _resolve_spec(base, value, is_file=name == "model"), None
        if key.kind == "preset":
            from .policy import preset_names

            names = preset_names()
            if value not in names:
                near = difflib.get_close_matches(value, names, n=2)
                hint = f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else ""
                return None, f"{name}: expected one of {', '.join(names)}, found {value!r}{hint}"
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
    if key.kind == "modules":
        items: list[str] = []
        if isinstance(value, dict):
            pairs = [(str(k), v) for k, v in value.items()]
        elif isinstance(value, list) and all(isinstance(v, str) and "=" in v for v in value):
            pairs = [(v.split("=", 1)[0].strip(), v.split("=", 1)[1].strip()) for v in value]
        else:
            return None, f"{name}: expected {expected}, found {_found(value)}"
        from .dtypes import parse_dtype

        for path, dtype in pairs:
            try:
                parse_dtype(dtype)
            except ValueError as exc:
                return None, f"{name}.{path}: {exc}"
            items.append(f"{path}={dtype}")
        return items, None
    raise AssertionError(key.kind)  # pragma: no cover


def _unknown(key: Any) -> str:
    text = str(key)
    underscored = text.replace("-", "_")
    if underscored in KEYS and underscored != text:
        return f"{text}: unknown key; config keys use underscores: write {underscored!r}"
    near = difflib.get_close_matches(underscored, list(KEYS), n=2, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else \
        f"; valid keys: {', '.join(sorted(KEYS))}"
    return f"{text}: unknown key{hint}"


def validate_config(data: Any, *, base: str | Path = ".", source: str | None = None,
                    command: str | None = None) -> dict[str, Any]:
    """Check a parsed config; returns {key: value} for `command` (all keys when None), paths resolved.

    Raises ConfigError listing every problem. `version` is checked and dropped.
    """
    base = Path(base)
    if data is None:
        raise ConfigError("the config is empty; expected a mapping such as `version: 1` and `model: model.py`",
                          source=source)
    if not isinstance(data, dict):
        raise ConfigError(f"a config is a YAML mapping of option names to values, found {_found(data)}",
                          source=source)
    problems: list[str] = []
    values: dict[str, Any] = {}
    for name, value in data.items():
        key = KEYS.get(name) if isinstance(name, str) else None
        if key is None:
            problems.append(_unknown(name))
            continue
        converted, problem = _check_value(name, key, value, base)
        if problem:
            problems.append(problem)
        else:
            values[name] = converted
    version = values.pop("version", CONFIG_VERSION)
    if "version" in data and isinstance(data["version"], int) and version != CONFIG_VERSION:
        if version > CONFIG_VERSION:
            problems.append(f"version: config version {version} is newer than this mpt reads "
                            f"({CONFIG_VERSION}); upgrade mpt-tuner")
        else:
            problems.append(f"version: expected {CONFIG_VERSION}, found {version}")
    tol = values.get("tolerance")
    if tol is not None and not values.get("absolute", False) and tol >= 1:
        problems.append(f"tolerance: a relative tolerance must be below 1 (0.01 = 1%), found {tol}; "
                        "set absolute: true for an absolute drop")
    if values.get("resume") and values.get("overwrite"):
        problems.append("resume and overwrite: give one of them, not both")
    if problems:
        raise ConfigError(problems, source=source)
    if command is not None:
        values = {k: v for k, v in values.items() if command in KEYS[k].commands}
    return values


def load_config(path: str | Path, *, command: str | None = None) -> dict[str, Any]:
    """Read a YAML config (safe_load) and validate it; paths are made relative to its folder.

    Returns {key: value} with the keys `command` uses (every key when None).
    """
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config {path} is a folder, expected a YAML file")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    data = load_yaml_file(path)
    return validate_config(data, base=path.parent, source=str(path), command=command)


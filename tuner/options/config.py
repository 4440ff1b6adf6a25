"""YAML config files for `mpt tune`, `mpt inspect` and `mpt check`.

A config's keys are the commands' option names (`max_evals`,
`lower_is_better`; the fields of `tuner.options.commands`), plus
`version: 1`; `model` is the model file, as everywhere. One file can serve
every command: each takes the keys it uses and ignores the others, so a
pipeline can run `mpt tune --config X` and then `mpt check --config X`. Keys
no command knows are errors.

The schema (a `Key` per config key) is read from the options dataclasses'
fields, so a key and its option cannot drift apart; values are checked by
the options' own `value_problem` and rules, so a file and a flag report the
same problem in the same words. Every problem is reported at once in a
ConfigError whose `fields` name the keys involved.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.core.errors import ConfigError
from tuner.core.yamlio import load_yaml_file
from tuner.options.commands import COMMAND_LINE_ONLY, COMMANDS, CONFIGURED
from tuner.options.fields import Kind, found, spec_of, value_problem
from tuner.options.shared import resume_rule, tolerance_rule

__all__ = ["CONFIG_VERSION", "KINDS", "Key", "Schema", "schema", "SCHEMA", "load_config", "validate_config"]

CONFIG_VERSION = 1
KINDS = tuple(k.value for k in Kind)


@dataclass(frozen=True)
class Key:
    """One config key: the kind of value it takes, the commands that use it, and its help."""

    kind: Kind
    commands: frozenset[str]
    help: str = ""
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    exclusive_min: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown config key kind {self.kind!r}; expected one of {', '.join(KINDS)}")
        object.__setattr__(self, "kind", Kind(self.kind))
        if (self.kind is Kind.CHOICE) != bool(self.choices):
            raise ValueError("a choice key needs choices, and only a choice key has them")


Schema = Mapping[str, Key]


def schema(commands: Iterable[str] = CONFIGURED) -> dict[str, Key]:
    """{key: Key} from the fields of the commands' options classes; one key has one kind everywhere."""
    rules: dict[str, tuple[Any, ...]] = {}
    helps: dict[str, str] = {}
    users: dict[str, set[str]] = {}
    for command in commands:
        for f in dataclasses.fields(COMMANDS[command]):
            spec = spec_of(f)
            rule = (spec.kind, spec.choices, spec.minimum, spec.exclusive_min)
            if rules.setdefault(f.name, rule) != rule:
                raise AssertionError(f"config key {f.name} has two kinds: {rules[f.name]} and {rule}")
            helps.setdefault(f.name, spec.help)
            users.setdefault(f.name, set()).add(command)
    return {name: Key(kind=kind, commands=frozenset(users[name]), help=helps[name], choices=choices,
                      minimum=minimum, exclusive_min=exclusive)
            for name, (kind, choices, minimum, exclusive) in rules.items()}


SCHEMA: Schema = schema()


def _cross_problems(values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Rules over several options that a config file obeys on its own: (fields, problem) pairs."""
    return [*tolerance_rule(values), *resume_rule(values)]


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
        return f"version: expected an integer, found {found(version)}"
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
        if kind is Kind.PATH:
            resolved[name] = _resolve(base, value)
        elif kind is Kind.MODEL_FILE and value.startswith("hf:"):  # a model folder: hf:PATH
            resolved[name] = "hf:" + _resolve(base, value[3:])
        elif kind in (Kind.MODEL_FILE, Kind.FUNCTION):
            head, sep, tail = value.rpartition(":")
            if sep and head and tail.isidentifier() and (kind is Kind.MODEL_FILE or head.lower().endswith(".py")):
                resolved[name] = f"{_resolve(base, head)}:{tail}"
            elif kind is Kind.MODEL_FILE or value.lower().endswith(".py"):
                resolved[name] = _resolve(base, value)
    return resolved


def validate_config(data: Any, schema: Schema = SCHEMA, *, base: str | Path = ".", source: str | None = None,
                    command: str | None = None) -> dict[str, Any]:
    """Check a parsed config against `schema`; returns {key: value} for `command` (all keys when None).

    `version: 1` is required, then dropped. Paths are made relative to
    `base`. Raises ConfigError listing every problem.
    """
    if data is None:
        raise ConfigError("the config is empty; expected a mapping such as `version: 1` and `model: model.py`",
                          source=source)
    if not isinstance(data, dict):
        raise ConfigError(f"a config is a YAML mapping of option names to values, found {found(data)}",
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
        converted, problem = value_problem(name, key, value)
        if problem:
            problems.append((name, problem))
        else:
            values[name] = converted
    problems += _cross_problems(values)
    if problems:
        raise ConfigError([p for _, p in problems], source=source, fields=[f for f, _ in problems])
    values = _resolve_paths(values, schema, Path(base))
    if command is not None:
        skip = COMMAND_LINE_ONLY.get(command, frozenset())
        values = {k: v for k, v in values.items() if command in schema[k].commands and k not in skip}
    return values


def load_config(path: str | Path, schema: Schema = SCHEMA, *, command: str | None = None) -> dict[str, Any]:
    """Read a YAML config (yaml.safe_load only) and validate it; paths become relative to its folder.

    Returns {key: value} with the keys `command` uses (every key when None), less those it takes from its
    command line only (`COMMAND_LINE_ONLY`: `mpt check` ignores a config's `tolerance`).
    """
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config {path} is a folder, expected a YAML file")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    data = load_yaml_file(path)
    return validate_config(data, schema, base=path.parent, source=str(path), command=command)

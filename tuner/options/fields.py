"""How an option is defined: one dataclass field carries everything a front end and a config file need.

`option(...)` returns a `dataclasses.field` whose metadata is a `Spec`: the
help, the kind of value (the config kinds below), choices, a lower bound,
and how the command line spells it (metavar, short flag, `--x/--no-x`,
repeatable, positional). The field's name is the config key and, with
dashes, the long flag (`max_evals` <-> `--max-evals`).

An options class derives from `Options`. Its `__post_init__` checks every
field by its Spec, then the class's rules over several fields (`_rules`),
and raises one ConfigError listing every problem, each naming its key
(`ConfigError.fields`), so the CLI can say `--max-evals` where the library
says `max_evals`. A config file's values are checked by the same
`value_problem`, so a flag and its key cannot disagree.
"""
from __future__ import annotations

import dataclasses
import difflib
import enum
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from tuner.core.dtypes import parse_dtype
from tuner.core.errors import ConfigError
from tuner.policy.presetfiles import preset_file

__all__ = ["Kind", "Spec", "option", "spec_of", "option_fields", "value_problem", "found", "Options"]


class Kind(str, enum.Enum):
    """The kind of value an option takes; it decides the check, the click type and the config's wording."""

    STR = "str"
    PATH = "path"
    MODEL_FILE = "model-file"  # MODEL.py[:build_fn]
    FUNCTION = "function"  # NAME or FILE.py:NAME
    BOOL = "bool"
    INT = "int"
    NUMBER = "number"
    CHOICE = "choice"
    PRESET = "preset"
    MODULES = "modules"  # {PATH: DTYPE} or ['PATH=DTYPE', ...]


_WORDS = {
    Kind.STR: "a string", Kind.PATH: "a path (string)", Kind.MODEL_FILE: "a path (string)",
    Kind.FUNCTION: "a string", Kind.BOOL: "true or false", Kind.INT: "an integer", Kind.NUMBER: "a number",
    Kind.CHOICE: "one of", Kind.PRESET: "a preset name",
    Kind.MODULES: "a mapping of module path to dtype, or a list of 'PATH=DTYPE' strings",
}
_TEXT_KINDS = (Kind.STR, Kind.PATH, Kind.MODEL_FILE, Kind.FUNCTION, Kind.PRESET)


class ValueRule(Protocol):
    """What checks one value: a Spec, or a config Key derived from Specs."""

    @property
    def kind(self) -> Kind: ...

    @property
    def choices(self) -> tuple[str, ...]: ...

    @property
    def minimum(self) -> float | None: ...

    @property
    def exclusive_min(self) -> bool: ...


@dataclass(frozen=True)
class Spec:
    """One option's definition (a field's metadata); see `option`."""

    help: str
    kind: Kind
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    exclusive_min: bool = False
    metavar: str | None = None
    short: str | None = None  # e.g. "-q"
    negatable: bool = False  # --x/--no-x (a bool that is on by default)
    multiple: bool = False  # repeatable on the command line
    positional: bool = False  # this command's argument, not an option
    required: str | None = None  # the problem when the value is missing (None: optional)
    replaces: tuple[str, ...] = ()  # options whose config value this one, given on the command line, replaces
    after: str | None = None  # listed in --help after this option (default: in field order)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", Kind(self.kind))
        if (self.kind is Kind.CHOICE) != bool(self.choices):
            raise ValueError("a choice option needs choices, and only a choice option has them")


_SPEC = "mpt_option"
T = TypeVar("T", bound="Options")


def option(default: Any, help: str, kind: Kind | str, **spec: Any) -> Any:  # noqa: A002
    """A dataclass field that is an option: `default` and the Spec's settings (help, kind, choices, ...)."""
    return dataclasses.field(default=default, metadata={_SPEC: Spec(help=help, kind=Kind(kind), **spec)})


def spec_of(f: dataclasses.Field[Any]) -> Spec:
    spec = f.metadata.get(_SPEC)
    if not isinstance(spec, Spec):
        raise TypeError(f"field {f.name} is not an option (define it with tuner.options.fields.option)")
    return spec


def option_fields(cls: type[Options] | Options) -> list[dataclasses.Field[Any]]:
    """The options of a class in the order --help lists them: the positional one first, then field order, with
    a field that names another in `after` moved behind it."""
    fields = sorted(dataclasses.fields(cls), key=lambda f: not spec_of(f).positional)
    for f in [f for f in fields if spec_of(f).after]:
        fields.remove(f)
        anchor = next(i for i, g in enumerate(fields) if g.name == spec_of(f).after)
        fields.insert(anchor + 1, f)
    return fields


def found(value: Any) -> str:
    """How a problem shows the value it refused: `'ten' (str)`, `a list`, `nothing (null)`."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, (dict, list, tuple)):
        return f"a {'mapping' if isinstance(value, dict) else 'list'}"
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return f"{shown} ({type(value).__name__})"


def value_problem(name: str, rule: ValueRule, value: Any) -> tuple[Any, str | None]:
    """(the value, normalised; None) or (None, the problem) for one option value, by its kind."""
    kind = Kind(rule.kind)
    expected = _WORDS[kind]
    if kind in _TEXT_KINDS:
        if not isinstance(value, str) or not value.strip():
            return None, f"{name}: expected {expected}, found {found(value)}"
        if kind is Kind.PRESET:
            try:
                preset_file(value.strip())
            except ConfigError as exc:
                return None, f"{name}: {exc.errors[0]}"
        return value.strip(), None
    if kind is Kind.BOOL:
        if not isinstance(value, bool):
            return None, f"{name}: expected {expected}, found {found(value)}"
        return value, None
    if kind in (Kind.INT, Kind.NUMBER):
        return _number_problem(name, rule, value)
    if kind is Kind.CHOICE:
        if not isinstance(value, str) or value.strip().lower() not in rule.choices:
            near = difflib.get_close_matches(str(value).lower(), rule.choices, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            return None, f"{name}: expected one of {', '.join(rule.choices)}, found {found(value)}{hint}"
        return value.strip().lower(), None
    return _modules_problem(name, value)


def _number_problem(name: str, rule: ValueRule, value: Any) -> tuple[Any, str | None]:
    expected = _WORDS[Kind(rule.kind)]
    ok = isinstance(value, int) if rule.kind == Kind.INT else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or (isinstance(value, float) and not math.isfinite(value)):
        return None, f"{name}: expected {expected}, found {found(value)}"
    low = rule.minimum
    if low is not None and (value <= low if rule.exclusive_min else value < low):
        return None, f"{name}: expected {expected} {'>' if rule.exclusive_min else '>='} {low:g}, found {value!r}"
    return value, None


def _modules_problem(name: str, value: Any) -> tuple[Any, str | None]:
    """Per-module overrides as ['PATH=DTYPE', ...] (the command line's form), from a mapping or such a list."""
    if isinstance(value, dict):
        pairs = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) and "=" in v for v in value):
        pairs = [(v.split("=", 1)[0].strip(), v.split("=", 1)[1].strip()) for v in value]
    else:
        return None, f"{name}: expected {_WORDS[Kind.MODULES]}, found {found(value)}"
    for path, dtype in pairs:
        try:
            parse_dtype(dtype)
        except ValueError as exc:
            return None, f"{name}.{path}: {exc}"
    return [f"{path}={dtype}" for path, dtype in pairs], None


@dataclass(frozen=True)
class Options:
    """Base of every options class: checks each field by its Spec, then the class's `_rules`, on construction.

    Raises ConfigError listing every problem; each names its key (`fields`).
    Valid values are normalised (strings stripped, choices lower case,
    module overrides as a tuple of 'PATH=DTYPE'). Options are given by name
    only: a positional one is a TypeError that says so (`TuneOptions("bf16",
    0.01)` would otherwise give 0.01 to the second field).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if args:
            names = [f.name for f in dataclasses.fields(cls)]
            given = ", ".join(map(repr, args))
            raise TypeError(f"{cls.__name__} takes its options by name, not by position: found {given}; write "
                            f"e.g. {cls.__name__}({names[0]}={args[0]!r}); its options: {', '.join(names)}")
        return super().__new__(cls)

    def __post_init__(self) -> None:
        problems: list[tuple[str, str]] = []
        bad: set[str] = set()
        for f in option_fields(self):
            spec, value = spec_of(f), getattr(self, f.name)
            if value is None or (spec.multiple and not value):
                if spec.required:
                    problems.append((f.name, spec.required))
                    bad.add(f.name)
                continue
            converted, problem = value_problem(f.name, spec, value)
            if problem:
                problems.append((f.name, problem))
                bad.add(f.name)
            else:
                object.__setattr__(self, f.name, tuple(converted) if isinstance(converted, list) else converted)
        problems += self._rules(bad)
        if problems:  # each problem starts with its option's key: the CLI spells it as its flag
            raise ConfigError([p for _, p in problems], fields=[f for f, _ in problems])

    def _rules(self, bad: Collection[str]) -> list[tuple[str, str]]:
        """Rules over several options, as (fields, problem); `bad` names the options that failed their own check."""
        return []

    @classmethod
    def from_layers(cls: type[T], values: Mapping[str, Any], given: Collection[str]) -> T:
        """The options from `values` (defaults < config < command line), where `given` names those set on the
        command line: an option given there drops the config's value of each option it `replaces`."""
        merged = dict(values)
        for f in dataclasses.fields(cls):
            if f.name in given:
                for other in spec_of(f).replaces:
                    if other not in given:
                        merged[other] = next(g.default for g in dataclasses.fields(cls) if g.name == other)
        return cls(**merged)

"""Precision policies: three op lists plus the rules for everything else.

A Policy is what a preset file holds. It says, for an op name, which rule
decides the precision of a call. Plans (plan.py) add per-module and
per-instance overrides on top of a Policy.
"""
from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.core.errors import ConfigError
from tuner.core.fileio import atomic_write_text
from tuner.core.yamlio import check_keys, load_yaml_file, read_text_file
from tuner.policy.modes import InplaceMode, NativeDevice, UnlistedMode
from tuner.policy.opnames import known_op_names, lookup_names, suggest
from tuner.policy.presetfiles import preset_file
from tuner.policy.rules import Rule

UNLISTED_RULES = UnlistedMode.choices()
INPLACE_RULES = InplaceMode.choices()


class OpProblemKind(enum.Enum):
    """What is wrong with one entry of an op list."""

    NOT_A_NAME = "not a name"
    DUPLICATE = "duplicate"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class OpListProblem:
    kind: OpProblemKind
    message: str


def op_list_problems(names: Iterable[str], what: str) -> list[OpListProblem]:
    """Every problem with a list of op names, each with its kind so callers can pick some without parsing text."""
    problems: list[OpListProblem] = []
    seen: set[str] = set()
    known = known_op_names()
    for name in names:
        if not isinstance(name, str) or not name.strip():
            problems.append(OpListProblem(OpProblemKind.NOT_A_NAME,
                                          f"{what}: op names must be non-empty strings, found {name!r}"))
            continue
        if name in seen:
            problems.append(OpListProblem(OpProblemKind.DUPLICATE, f"{what}: op {name!r} is listed twice"))
        seen.add(name)
        if name not in known:
            near = suggest(name)
            hint = f"; did you mean {', '.join(near)}?" if near else ""
            problems.append(OpListProblem(OpProblemKind.UNKNOWN, f"{what}: unknown op {name!r}{hint}"))
    return problems


def check_op_names(names: Iterable[str], what: str) -> list[str]:
    """Problems with a list of op names as messages: unknown names (with suggestions) and duplicates."""
    return [p.message for p in op_list_problems(names, what)]


@dataclass(frozen=True)
class Policy:
    """Op lists and rules: what a preset file holds. Validated on construction: an op in two lists is an error.

    The settings `unlisted`, `inplace` and `native` may be given as their enum members or their
    strings (as a preset file has them); they are stored as members. Raises ConfigError listing
    every problem (unknown op names, bad settings) at once.
    """

    name: str
    lower: frozenset[str] = frozenset()
    fp32: frozenset[str] = frozenset()
    promote: frozenset[str] = frozenset()
    banned: frozenset[str] = frozenset()
    unlisted: UnlistedMode = UnlistedMode.PASSTHROUGH
    inplace: InplaceMode = InplaceMode.SKIP
    device: str | None = None
    dtype: str = "bf16"
    description: str = ""
    source: str = ""
    native: NativeDevice | None = None  # set when the lists are torch.autocast's own for that device
    _table: dict[str, Rule] = field(default_factory=dict, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        for attr in ("lower", "fp32", "promote", "banned"):
            value = getattr(self, attr)
            if not isinstance(value, frozenset):
                object.__setattr__(self, attr, frozenset(value))
        problems: list[str] = []
        both = sorted(self.lower & self.fp32)
        if both:
            problems.append(f"ops in both the lower-precision and the FP32 list: {', '.join(both)}")
        problems += self._settings_problems()
        if self.device not in (None, "cpu", "cuda"):
            problems.append(f"device: expected cpu, cuda or null, found {self.device!r}")
        for attr in ("lower", "fp32", "promote", "banned"):
            problems += [p.message for p in op_list_problems(sorted(getattr(self, attr)), attr)]
        if problems:
            raise ConfigError(problems, source=f"policy {self.name!r}")
        table: dict[str, Rule] = {}
        # Promote first so the lower/FP32 lists take precedence over it (HMP's rule).
        for rule, ops in ((Rule.PROMOTE, self.promote), (Rule.LOWER, self.lower), (Rule.FP32, self.fp32),
                          (Rule.BANNED, self.banned)):
            table.update(dict.fromkeys(ops, rule))
        self._table.update(table)

    def _settings_problems(self) -> list[str]:
        """Turn the str settings into their enum members; a message for each value that is none."""
        problems = []
        for attr, kind, choices in (("unlisted", UnlistedMode, UNLISTED_RULES), ("inplace", InplaceMode, INPLACE_RULES),
                                    ("native", NativeDevice, ("cpu", "cuda", "null"))):
            value = getattr(self, attr)
            if value is None and attr == "native":
                continue
            try:
                object.__setattr__(self, attr, kind(value))
            except ValueError:
                problems.append(f"{attr}: expected one of {', '.join(choices)}, found {value!r}")
        return problems

    @property
    def unlisted_rule(self) -> Rule:
        """The rule for ops no list names."""
        return Rule.unlisted(self.unlisted)

    def lookup(self, name: str) -> tuple[Rule, str]:
        """(rule, detail) for an op name, trying its aliases; detail is `as matmul` when an alias matched."""
        for candidate in lookup_names(name):
            rule = self._table.get(candidate)
            if rule is not None:
                return rule, "" if candidate == name else f"as {candidate}"
        return self.unlisted_rule, ""

    def rule_for(self, name: str) -> tuple[Rule, str]:
        """(rule, reason text) for an op name, e.g. (Rule.LOWER, "lower list (as matmul)")."""
        rule, detail = self.lookup(name)
        return rule, rule.describe(detail)

    def lists(self, name: str) -> bool:
        """Does a list name this op itself (not through an alias)?"""
        return name in self._table

    def names(self, name: str) -> bool:
        """Does any list name this op (directly or through an alias)?"""
        return any(c in self._table for c in lookup_names(name))

    def replace(self, **changes: Any) -> Policy:
        changes.setdefault("native", None)
        return dataclasses.replace(self, _table={}, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "dtype": self.dtype,
            "device": self.device,
            "native": self.native.value if self.native is not None else None,
            "unlisted": self.unlisted.value,
            "inplace": self.inplace.value,
            "lower": sorted(self.lower),
            "fp32": sorted(self.fp32),
            "promote": sorted(self.promote),
            "banned": sorted(self.banned),
        }


_POLICY_KEYS = {"version", "name", "description", "source", "dtype", "device", "native", "unlisted",
                "inplace", "lower", "fp32", "promote", "banned"}


def policy_from_dict(data: Any, *, source: str) -> Policy:
    if not isinstance(data, dict):
        raise ConfigError(f"expected a mapping, found {type(data).__name__}", source=source)
    problems = check_keys(data, _POLICY_KEYS, where="")
    if data.get("version", 1) != 1:
        problems.append(f"version: this mpt reads version 1, found {data.get('version')!r}")
    lists: dict[str, list[str]] = {}
    for key in ("lower", "fp32", "promote", "banned"):
        value = data.get(key) or []
        if not isinstance(value, list):
            problems.append(f"{key}: expected a list of op names, found {type(value).__name__}")
            value = []
        # Only duplicates here: a list read into a frozenset loses them; Policy() reports the rest.
        problems += [p.message for p in op_list_problems(value, key) if p.kind is OpProblemKind.DUPLICATE]
        lists[key] = value
    if problems:
        raise ConfigError(problems, source=source)
    return Policy(
        name=str(data.get("name") or Path(source).stem),
        lower=frozenset(lists["lower"]),
        fp32=frozenset(lists["fp32"]),
        promote=frozenset(lists["promote"]),
        banned=frozenset(lists["banned"]),
        unlisted=data.get("unlisted", "passthrough"),
        inplace=data.get("inplace", "skip"),
        device=data.get("device"),
        dtype=data.get("dtype", "bf16"),
        description=data.get("description", ""),
        source=data.get("source", ""),
        native=data.get("native"),
    )


_PRESET_CACHE: dict[str, Policy] = {}


def load_preset(name: str) -> Policy:
    """A shipped preset by name (`hmp`, `gaudi`, `xla`, `torch-cpu`...), read once and cached.

    Raises ConfigError for an unknown name, with the closest names (or all of them).
    """
    if name in _PRESET_CACHE:
        return _PRESET_CACHE[name]
    path = preset_file(name)
    policy = policy_from_dict(load_yaml_file(path), source=str(path))
    _PRESET_CACHE[name] = policy
    return policy


def read_op_list(path: str | Path) -> list[str]:
    """Read an op-list file: newline-separated names (HMP/Gaudi format) or YAML (a list, or `ops:`).

    `#` starts a comment in text files. Returns the names in file order.
    Raises ConfigError for a missing file, and for unknown names and
    duplicates, all reported at once with suggestions.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"op-list file not found: {path}")
    if path.suffix in (".yaml", ".yml"):
        data = load_yaml_file(path)
        if isinstance(data, dict):
            extra = set(data) - {"version", "ops"}
            if extra:
                raise ConfigError(f"unknown keys {sorted(extra)}; an op-list YAML has `ops:` (and `version:`)",
                                  source=str(path))
            data = data.get("ops")
        if not isinstance(data, list):
            raise ConfigError("expected a YAML list of op names (or a mapping with `ops:`)", source=str(path))
        names = [str(x).strip() if isinstance(x, str) else x for x in data]
    else:
        names = []
        for line in read_text_file(path).splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                names.append(line)
    problems = check_op_names(names, path.name)
    if problems:
        raise ConfigError(problems, source=str(path))
    return names


def write_op_list(path: str | Path, names: Iterable[str], header: str = "") -> None:
    """Write names one per line (sorted), the format HMP and Gaudi read."""
    lines = [f"# {line}" for line in header.splitlines()] if header else []
    lines += sorted(set(names))
    atomic_write_text(path, "\n".join(lines) + "\n")


def custom_policy(base: Policy, *, lower_file: str | Path | None = None, fp32_file: str | Path | None = None,
                  lower: Iterable[str] | None = None, fp32: Iterable[str] | None = None) -> Policy:
    """Replace a policy's lower/FP32 lists (HMP's bf16_file_path/fp32_file_path behaviour)."""
    new_lower = set(base.lower)
    new_fp32 = set(base.fp32)
    if lower_file:
        new_lower = set(read_op_list(lower_file))
    if fp32_file:
        new_fp32 = set(read_op_list(fp32_file))
    if lower is not None:
        new_lower = set(lower)
    if fp32 is not None:
        new_fp32 = set(fp32)
    if lower_file or lower is not None:
        if not (fp32_file or fp32 is not None):
            new_fp32 -= new_lower  # a custom lower list wins over the default FP32 list
    elif fp32_file or fp32 is not None:
        new_lower -= new_fp32
    return base.replace(name=f"{base.name}+custom", lower=frozenset(new_lower), fp32=frozenset(new_fp32))

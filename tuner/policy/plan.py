"""Precision plans: a preset plus what tuning (or the user) changed, saved as YAML.

A plan is the unit users commit, `mpt inspect --plan` shows and `tuner.load`
applies: the lower dtype, the preset, optional replacement op lists,
per-module overrides (dotted path or glob -> dtype) and per-instance
overrides (module path + op name + call index -> dtype): FP32, or the first fallback, the other 16-bit dtype
(`fallback`, `fallback_instances`: a plan tuned with a fallback chain, `mpt tune --dtype fp16 --fallback bf16`).
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from tuner.core.dtypes import parse_dtype, short_name
from tuner.core.errors import ConfigError, PlanMismatchError
from tuner.core.fileio import atomic_write_text
from tuner.core.fingerprint import structure_digest
from tuner.core.output_files import PLAN_NAME
from tuner.core.yamlio import check_keys, load_yaml_file
from tuner.policy.opnames import lookup_names
from tuner.policy.presets import Policy, check_op_names, load_preset

PLAN_VERSION = 1

# What `metrics` in a plan may hold (what `mpt tune` writes), each with the type its value must have.
# "status" and "stopped" are the values of tuner.search.results.TuneStatus and StopReason.
PLAN_STATUSES = ("ok", "not_met")
STOP_REASONS = ("max_evals", "time_budget", "interrupted")
_REAL, _REAL_OR_NULL, _COUNT, _BOOL = "a number", "a number or null", "an integer >= 0", "true or false"
METRIC_KINDS = {"baseline": _REAL, "tuned": _REAL_OR_NULL, "target": _REAL, "tolerance": _REAL,
                "absolute": _BOOL, "lower_is_better": _BOOL, "noise": _REAL, "evaluations": _COUNT,
                "candidates": _COUNT, "status": "one of " + ", ".join(PLAN_STATUSES),
                "stopped": "null or one of " + ", ".join(STOP_REASONS)}


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _fits(kind: str, value: Any) -> bool:
    if kind == _BOOL:
        return isinstance(value, bool)
    if kind == _COUNT:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    if kind in (_REAL, _REAL_OR_NULL):
        return _is_real(value) or (value is None and kind == _REAL_OR_NULL)
    if kind.startswith("null"):
        return value is None or value in STOP_REASONS
    return value in PLAN_STATUSES


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 30 else text[:27] + '...'}"


def metrics_problems(metrics: Any) -> list[str]:
    """One problem per unknown key or value of the wrong type in a plan's `metrics` (a quoted "false" is a
    string, not a boolean: it is refused, never read as true)."""
    if not isinstance(metrics, dict):
        return [f"metrics: expected a mapping, found {type(metrics).__name__}"]
    problems = check_keys(metrics, METRIC_KINDS, where="metrics.")
    for key, kind in METRIC_KINDS.items():
        if key in metrics and not _fits(kind, metrics[key]):
            problems.append(f"metrics.{key}: expected {kind}, found {_shown(metrics[key])}")
    return problems


def _is_path(value: Any) -> bool:
    """A module path: a string, or an integer YAML reads from an unquoted `0` (nn.Sequential's child "0")."""
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _str_problems(data: dict[str, Any], keys: tuple[str, ...], where: str = "") -> list[str]:
    return [f"{where}{k}: expected a string, found {_shown(data[k])}"
            for k in keys if k in data and not isinstance(data[k], str)]


@dataclass(frozen=True, order=True)
class OpInstance:
    """One op call site: the `index`-th call of `op` made directly by module `module`."""

    module: str
    op: str
    index: int = 0

    def key(self) -> tuple[str, str, int]:
        """(module, op, index): the key of `PrecisionEngine.instance_overrides` and of recorded Decisions."""
        return (self.module, self.op, self.index)

    def label(self) -> str:
        """As printed: `encoder.0:linear#1`, `(root)` for the model's own calls."""
        mod = self.module or "(root)"
        return f"{mod}:{self.op}#{self.index}"


@dataclass(frozen=True)
class ModelRef:
    """Which model a plan (or journal) was made for, recorded as data.

    `file` is the model file and `build`/`eval`/`inputs` the function specs
    the user gave (a name, or FILE.py:NAME), files relative to the plan's
    folder; None means the default name; no `file` when the functions came from a notebook or a script's
    `__main__` (`tuner.tune(out=)`), which no one can import to rebuild the model. `structure` (module paths, parameter
    names and shapes), `weights` (the FP32 state dict) and `source` (the
    user's files) are digests from `tuner.core.fingerprint`.
    """

    file: str | None = None
    build: str | None = None
    eval: str | None = None
    inputs: str | None = None
    structure: str = ""
    weights: str = ""
    source: str = ""
    metric: str | None = None
    output: str | None = None
    data: str | None = None
    tokenizer: str | None = None
    batch_size: int | None = None

    FIELDS = ("file", "build", "eval", "inputs", "structure", "weights", "source", "metric", "output", "data",
              "tokenizer", "batch_size")

    def __post_init__(self) -> None:
        problems = [f"model.{k}: expected a string, found {type(getattr(self, k)).__name__}"
                    for k in self.FIELDS if getattr(self, k) is not None and not isinstance(getattr(self, k), str)
                    and k != "batch_size"]
        if self.batch_size is not None and (not isinstance(self.batch_size, int) or isinstance(self.batch_size, bool)
                                            or self.batch_size < 1):
            problems.append(f"model.batch_size: expected an integer >= 1, found {self.batch_size!r}")
        if self.file is not None and not self.file:
            problems.append("model.file: empty (leave the key out when there is no model file)")
        if problems:
            raise ConfigError(problems, source="plan")

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.FIELDS if getattr(self, k)}

    @classmethod
    def from_dict(cls, data: Any) -> ModelRef:
        if not isinstance(data, dict):
            raise ConfigError(f"model: expected a mapping, found {type(data).__name__}", source="plan")
        problems = check_keys(data, cls.FIELDS, where="model.")
        if problems:
            raise ConfigError(problems, source="plan")
        return cls(**{k: data[k] for k in cls.FIELDS if k in data})

    def file_from(self, folder: str | Path | None) -> str | None:
        """The recorded model file (or `hf:` folder) as a path from the working directory: plan.yaml records it
        relative to its own `folder`, which a message must not suggest as it is. As recorded without `folder`."""
        if self.file is None or folder is None:
            return self.file
        prefix = "hf:" if self.file.startswith("hf:") else ""
        path = Path(self.file[len(prefix):]).expanduser()
        return prefix + (str(path) if path.is_absolute() else os.path.relpath(os.path.normpath(Path(folder) / path)))

    def check_structure(self, model: Any, *, what: str = "the plan", folder: str | Path | None = None) -> None:
        """PlanMismatchError when `model` is not the architecture this was made for (`folder`: the plan's, so
        the paths it names are paths from the working directory)."""
        if not self.structure:
            return
        if structure_digest(model) != self.structure:
            file = self.file_from(folder)
            hint = (f'; tuner.load("{file}", OUT) builds the model as the tune did'
                    if file is not None and file.startswith("hf:") else "")
            raise PlanMismatchError(f"{what} was made for another model ({file or 'no model file'}): its "
                                    f"module tree or parameter shapes differ from this model's{hint}")


@dataclass(frozen=True)
class Plan:
    """What `mpt tune` writes to plan.yaml: a preset, optional replacement op lists, and the overrides found.

    A plan is a policy plus overrides: `preset` names the Policy (its op lists replaced by `lower`/`fp32`/`promote`
    when given), `modules` maps module paths or globs to a dtype, and `fp32_instances` are the single op calls the
    search kept in FP32. `dtype` is the lower dtype, stored by its short name (`bf16`, `fp16`). `fallback` is the
    other 16-bit dtype where the tune had a fallback chain, and `fallback_instances` the op calls that compute in it
    rather than in `dtype` (an fp16 overflow runs in bf16 at the same speed, where FP32 would cost it); both absent
    from older plans, which read as they did. `metrics`, `model` and `checkpoint_sha256` are records of the run and
    of the model it was made for; they do not change what runs. `for_training` marks a plan tuned for training (`mpt
    tune --for-training`): its weights are the user's FP32 ones, only compute is lowered. Validated on construction
    (ConfigError listing every problem).
    """

    dtype: str = "bf16"
    preset: str = "torch-cpu"
    lower: tuple[str, ...] | None = None
    fp32: tuple[str, ...] | None = None
    promote: tuple[str, ...] | None = None
    modules: tuple[tuple[str, str], ...] = ()
    fp32_instances: tuple[OpInstance, ...] = ()
    fallback: str | None = None
    fallback_instances: tuple[OpInstance, ...] = ()
    metrics: Mapping[str, Any] = field(default_factory=dict, compare=False)
    version: int = PLAN_VERSION
    model: ModelRef | None = field(default=None, compare=False)
    checkpoint_sha256: str | None = field(default=None, compare=False)
    for_training: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        problems: list[str] = []
        if not isinstance(self.for_training, bool):
            problems.append(f"for_training: expected true or false, found {_shown(self.for_training)}")
        try:
            dt = parse_dtype(self.dtype, lower_only=True)
            object.__setattr__(self, "dtype", short_name(dt))
        except ValueError as exc:
            problems.append(f"dtype: {exc}")
        if self.version != PLAN_VERSION:
            if isinstance(self.version, int) and self.version > PLAN_VERSION:
                problems.append(f"version: plan version {self.version} is newer than this mpt reads "
                                f"({PLAN_VERSION}); upgrade mpt-tuner")
            else:
                problems.append(f"version: expected {PLAN_VERSION}, found {self.version!r}")
        for attr in ("lower", "fp32", "promote"):
            value = getattr(self, attr)
            if value is not None:
                object.__setattr__(self, attr, tuple(value))
                problems += check_op_names(value, attr)
        mods = tuple((str(k), str(v)) for k, v in (self.modules.items() if isinstance(self.modules, Mapping)
                                                     else self.modules))
        object.__setattr__(self, "modules", mods)
        for pattern, value in mods:
            try:
                parse_dtype(value)
            except ValueError as exc:
                problems.append(f"modules.{pattern}: {exc}")
        insts = tuple(i if isinstance(i, OpInstance) else OpInstance(*i) for i in self.fp32_instances)
        object.__setattr__(self, "fp32_instances", insts)
        problems += self._fallback_problems()
        if problems:
            raise ConfigError(problems, source="plan")
        if self.lower is not None and self.fp32 is not None:
            both = sorted(set(self.lower) & set(self.fp32))
            if both:
                raise ConfigError(f"ops in both the lower-precision and the FP32 list: {', '.join(both)}",
                                  source="plan")
        self.policy()  # validates the preset name and the combined lists

    def _fallback_problems(self) -> list[str]:
        """`fallback` normalized to its short name; one problem per way it or `fallback_instances` is wrong."""
        others = tuple(i if isinstance(i, OpInstance) else OpInstance(*i) for i in self.fallback_instances)
        object.__setattr__(self, "fallback_instances", others)
        if self.fallback is None:
            return [f"fallback_instances: {len(others)} instance(s) but no fallback dtype; add `fallback: bf16` "
                    "or `fallback: fp16`"] if others else []
        try:
            object.__setattr__(self, "fallback", short_name(parse_dtype(self.fallback, lower_only=True)))
        except (ValueError, TypeError) as exc:
            return [f"fallback: {exc}"]
        problems = []
        if self.fallback == self.dtype:
            problems.append(f"fallback: the fallback dtype must be the other 16-bit dtype, not the plan's own "
                            f"({self.dtype})")
        both = sorted(i.label() for i in set(others) & set(self.fp32_instances))
        if both:
            problems.append(f"fallback_instances: in fp32_instances too: {', '.join(both[:5])}")
        return problems

    # ----- resolution ---------------------------------------------------------
    @property
    def torch_dtype(self) -> torch.dtype:
        """`dtype` as a torch.dtype."""
        return parse_dtype(self.dtype)

    @property
    def fallback_dtype(self) -> torch.dtype | None:
        """`fallback` as a torch.dtype (None without a fallback chain)."""
        return parse_dtype(self.fallback) if self.fallback is not None else None

    def instance_dtypes(self) -> dict[OpInstance, str]:
        """Each overridden instance -> the short name of the dtype it computes in (`fp32` or `fallback`)."""
        found = {i: "fp32" for i in self.fp32_instances}
        found.update({i: str(self.fallback) for i in self.fallback_instances})
        return found

    def policy(self) -> Policy:
        """The preset with the plan's op lists in place (a list given alone wins over the other)."""
        base = load_preset(self.preset)
        if self.lower is None and self.fp32 is None and self.promote is None:
            return base
        lower = set(self.lower) if self.lower is not None else set(base.lower)
        fp32 = set(self.fp32) if self.fp32 is not None else set(base.fp32)
        if self.lower is not None and self.fp32 is None:
            fp32 -= lower
        if self.fp32 is not None and self.lower is None:
            lower -= fp32
        promote = set(self.promote) if self.promote is not None else set(base.promote)
        return base.replace(name=f"{base.name}+plan", lower=frozenset(lower), fp32=frozenset(fp32),
                            promote=frozenset(promote))

    def with_types_fp32(self, types: frozenset[str]) -> Plan:
        """This plan with each op type in `types` moved to its FP32 list (and the lower-list name it matched,
        through an alias or itself, out of the lower list): how op-type lists keep a type FP32 everywhere.

        A plan with its own lists runs per op call wherever it is attached (`tuner.engine.attach`: no longer
        torch.autocast's own lists), as `tuner.convert` runs the list files, never as module regions, which
        would run the other ops of a module that calls one of `types` in FP32 too."""
        policy = self.policy()
        matched = {name for t in types for name in lookup_names(t) if name in policy.lower}
        return dataclasses.replace(self, lower=tuple(sorted(policy.lower - matched - types)),
                                   fp32=tuple(sorted(policy.fp32 | types)))

    def module_overrides(self) -> dict[str, torch.dtype]:
        """Module path or glob -> dtype, as the engine takes them."""
        return {pattern: parse_dtype(value) for pattern, value in self.modules}

    def instance_overrides(self) -> dict[tuple[str, str, int], torch.dtype]:
        """(module, op, index) -> float32 for each FP32 instance, and -> the fallback dtype for each fallback
        instance, as the engine takes them."""
        found = {inst.key(): torch.float32 for inst in self.fp32_instances}
        other = self.fallback_dtype
        if other is not None:
            found.update({inst.key(): other for inst in self.fallback_instances})
        return found

    # ----- YAML ---------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"version": self.version, "dtype": self.dtype, "preset": self.preset}
        if self.for_training:  # absent otherwise: plans from before training mode read as they did
            data["for_training"] = True
        for attr in ("lower", "fp32", "promote"):
            value = getattr(self, attr)
            if value is not None:
                data[attr] = sorted(value)
        if self.modules:
            data["modules"] = {k: v for k, v in self.modules}
        data["fp32_instances"] = [{"module": i.module, "op": i.op, "index": i.index}
                                  for i in sorted(self.fp32_instances)]
        if self.fallback is not None:  # absent otherwise: plans without a fallback chain read as they did
            data["fallback"] = self.fallback
            data["fallback_instances"] = [{"module": i.module, "op": i.op, "index": i.index}
                                          for i in sorted(self.fallback_instances)]
        if self.metrics:
            data["metrics"] = dict(self.metrics)
        if self.model is not None:
            data["model"] = self.model.to_dict()
        if self.checkpoint_sha256:
            data["checkpoint_sha256"] = self.checkpoint_sha256
        return data

    def save(self, path: str | Path, *, header: str = "") -> None:
        # no time stamp: a plan re-tuned with the same result is byte-identical (report.json has the time)
        lines = ["# mpt precision plan"]
        lines += [f"# {h}" for h in header.splitlines()] if header else []
        lines.append("# Load with: tuner.autocast(PATH) | mpt inspect MODEL --plan PATH | tuner.load(model, DIR)")
        text = "\n".join(lines) + "\n" + yaml.safe_dump(self.to_dict(), sort_keys=False)
        atomic_write_text(path, text)

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "plan") -> Plan:
        if not isinstance(data, dict):
            raise ConfigError(f"a plan is a YAML mapping, found {type(data).__name__}", source=source)
        allowed = {"version", "dtype", "preset", "lower", "fp32", "promote", "modules", "fp32_instances", "metrics",
                   "model", "checkpoint_sha256", "for_training", "fallback", "fallback_instances"}
        problems = check_keys(data, allowed, where="")
        model_ref = None
        if data.get("model") is not None:
            try:
                model_ref = ModelRef.from_dict(data["model"])
            except ConfigError as exc:
                problems += exc.errors
        digest = data.get("checkpoint_sha256")
        problems += _str_problems(data, ("dtype", "preset", "checkpoint_sha256", "fallback"))
        version = data.get("version", PLAN_VERSION)
        if not isinstance(version, int) or isinstance(version, bool):
            problems.append(f"version: expected an integer, found {_shown(version)}")
        if data.get("metrics") is not None:
            problems += metrics_problems(data["metrics"])
        insts, more = _instances(data.get("fp32_instances"))
        others, more_others = _instances(data.get("fallback_instances"), "fallback_instances")
        problems += more + more_others
        modules = data.get("modules") or {}
        if not isinstance(modules, dict):
            problems.append(f"modules: expected a mapping of module path/glob to dtype, found {type(modules).__name__}")
            modules = {}
        problems += [f"modules.{k}: expected a module path and a dtype name (strings), found {_shown(k)}: "
                     f"{_shown(v)}" for k, v in modules.items() if not (_is_path(k) and isinstance(v, str))]
        for attr in ("lower", "fp32", "promote"):
            if attr in data and not isinstance(data[attr], list):
                problems.append(f"{attr}: expected a list of op names, found {type(data[attr]).__name__}")
            elif attr in data:
                problems += [f"{attr}[{n}]: expected an op name (a string), found {_shown(v)}"
                             for n, v in enumerate(data[attr]) if not isinstance(v, str)]
        if problems:
            raise ConfigError(problems, source=source)
        try:
            return cls(
                dtype=data.get("dtype", "bf16"),
                preset=data.get("preset", "torch-cpu"),
                lower=data.get("lower"),
                fp32=data.get("fp32"),
                promote=data.get("promote"),
                modules=tuple(modules.items()),
                fp32_instances=tuple(insts),
                fallback=data.get("fallback"),
                fallback_instances=tuple(others),
                metrics=data.get("metrics") or {},
                version=version,
                model=model_ref,
                checkpoint_sha256=digest,
                for_training=data.get("for_training", False),
            )
        except ConfigError as exc:
            raise ConfigError(exc.errors, source=source) from None

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        """Read a plan file, or the plan of a `mpt tune` output folder; ConfigError when it is not a valid plan."""
        path = Path(path)
        if path.is_dir():
            path = path / PLAN_NAME
        return cls.from_dict(load_yaml_file(path), source=str(path))


def _instances(items: Any, key: str = "fp32_instances") -> tuple[list[OpInstance], list[str]]:
    """The `key` instances of a plan's YAML, and one problem per item that is not {module, op, index}."""
    if items is None:
        return [], []
    if not isinstance(items, list):
        return [], [f"{key}: expected a list, found {type(items).__name__}"]
    insts, problems = [], []
    for n, item in enumerate(items):
        if not isinstance(item, dict) or not {"module", "op"} <= set(item):
            problems.append(f"{key}[{n}]: expected a mapping with module, op and index")
            continue
        where = f"{key}[{n}]."
        found = check_keys(item, {"module", "op", "index"}, where=where) + _str_problems(item, ("op",), where)
        if not _is_path(item["module"]):
            found.append(f"{where}module: expected a module path (a string), found {_shown(item['module'])}")
        index = item.get("index", 0)
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            found.append(f"{where}index: expected an integer >= 0, found {_shown(index)}")
        if not found:
            insts.append(OpInstance(str(item["module"]), item["op"], index))
        problems += found
    return insts, problems

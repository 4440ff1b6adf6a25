"""Precision plans: a preset plus what tuning (or the user) changed, saved as YAML.

A plan is the unit users commit, `mpt inspect --plan` shows and `tuner.load`
applies: the lower dtype, the preset, optional replacement op lists,
per-module overrides (dotted path or glob -> dtype) and per-instance
overrides (module path + op name + call index -> dtype).
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch
import yaml

from .dtypes import parse_dtype, short_name
from .errors import ConfigError
from .fileio import atomic_write_text
from .policy import Policy, check_op_names, load_preset
from .yamlio import check_keys, load_yaml_file

PLAN_VERSION = 1


@dataclass(frozen=True, order=True)
class OpInstance:
    """One op call site: the `index`-th call of `op` made directly by module `module`."""

    module: str
    op: str
    index: int = 0

    def key(self) -> tuple[str, str, int]:
        return (self.module, self.op, self.index)

    def label(self) -> str:
        mod = self.module or "(root)"
        return f"{mod}:{self.op}#{self.index}"


@dataclass(frozen=True)
class Plan:
    dtype: str = "bf16"
    preset: str = "torch-cpu"
    lower: tuple[str, ...] | None = None
    fp32: tuple[str, ...] | None = None
    promote: tuple[str, ...] | None = None
    modules: tuple[tuple[str, str], ...] = ()
    fp32_instances: tuple[OpInstance, ...] = ()
    metrics: Mapping[str, Any] = field(default_factory=dict, compare=False)
    version: int = PLAN_VERSION

    def __post_init__(self) -> None:
        problems: list[str] = []
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
        if problems:
            raise ConfigError(problems, source="plan")
        if self.lower is not None and self.fp32 is not None:
            both = sorted(set(self.lower) & set(self.fp32))
            if both:
                raise ConfigError(f"ops in both the lower-precision and the FP32 list: {', '.join(both)}",
                                  source="plan")
        self.policy()  # validates the preset name and the combined lists

    # ----- resolution ---------------------------------------------------------
    @property
    def torch_dtype(self) -> torch.dtype:
        return parse_dtype(self.dtype)

    def policy(self) -> Policy:
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

    def module_overrides(self) -> dict[str, torch.dtype]:
        return {pattern: parse_dtype(value) for pattern, value in self.modules}

    def instance_overrides(self) -> dict[tuple[str, str, int], torch.dtype]:
        return {inst.key(): torch.float32 for inst in self.fp32_instances}

    # ----- YAML ---------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"version": self.version, "dtype": self.dtype, "preset": self.preset}
        for attr in ("lower", "fp32", "promote"):
            value = getattr(self, attr)
            if value is not None:
                data[attr] = sorted(value)
        if self.modules:
            data["modules"] = {k: v for k, v in self.modules}
        data["fp32_instances"] = [{"module": i.module, "op": i.op, "index": i.index}
                                  for i in sorted(self.fp32_instances)]
        if self.metrics:
            data["metrics"] = dict(self.metrics)
        return data

    def save(self, path: str | Path, *, header: str = "") -> None:
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        lines = [f"# mpt precision plan, written {stamp}"]
        lines += [f"# {h}" for h in header.splitlines()] if header else []
        lines.append("# Load with: tuner.autocast(PATH) | mpt inspect MODEL --plan PATH | tuner.load(model, DIR)")
        text = "\n".join(lines) + "\n" + yaml.safe_dump(self.to_dict(), sort_keys=False)
        atomic_write_text(path, text)

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "plan") -> "Plan":
        if not isinstance(data, dict):
            raise ConfigError(f"a plan is a YAML mapping, found {type(data).__name__}", source=source)
        allowed = {"version", "dtype", "preset", "lower", "fp32", "promote", "modules", "fp32_instances", "metrics"}
        problems = check_keys(data, allowed, where="")
        insts = []
        for n, item in enumerate(data.get("fp32_instances") or []):
            if not isinstance(item, dict) or not {"module", "op"} <= set(item):
                problems.append(f"fp32_instances[{n}]: expected a mapping with module, op and index")
                continue
            problems += check_keys(item, {"module", "op", "index"}, where=f"fp32_instances[{n}].")
            index = item.get("index", 0)
            if not isinstance(index, int) or index < 0:
                problems.append(f"fp32_instances[{n}].index: expected an integer >= 0, found {index!r}")
                continue
            insts.append(OpInstance(str(item["module"]), str(item["op"]), index))
        modules = data.get("modules") or {}
        if not isinstance(modules, dict):
            problems.append(f"modules: expected a mapping of module path/glob to dtype, found {type(modules).__name__}")
            modules = {}
        for attr in ("lower", "fp32", "promote"):
            if attr in data and not isinstance(data[attr], list):
                problems.append(f"{attr}: expected a list of op names, found {type(data[attr]).__name__}")
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
                metrics=data.get("metrics") or {},
                version=data.get("version", PLAN_VERSION),
            )
        except ConfigError as exc:
            raise ConfigError(exc.errors, source=source) from None

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        path = Path(path)
        if path.is_dir():
            path = path / "plan.yaml"
        return cls.from_dict(load_yaml_file(path), source=str(path))

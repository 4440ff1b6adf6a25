"""mpt-tuner: per-op precision policies for PyTorch, an accuracy-driven FP32 fallback search, inspection.

Data flow: model file (loader) -> policy/plan (policy, plan) -> engine (engine, api)
-> inspect (audit) / search (search, tune) -> outputs (outputs, checkpoint).

The public names load on first use, so `import tuner.errors` (what the CLI needs to start and say
something) does not import torch.
"""
from __future__ import annotations

import importlib
import sys
import types
from typing import Any

__version__ = "0.1.0"

_HOME = {  # public name -> the submodule that defines it
    "autocast": "api", "convert": "api", "revert": "api", "attach": "api", "detach": "api", "attached": "api",
    "disable_casts": "engine", "Decision": "engine", "load": "checkpoint", "tune": "tune",
    "TuneOptions": "tune", "TuneResult": "tune", "inspect_model": "audit", "Plan": "plan", "OpInstance": "plan",
    "Policy": "policy", "load_preset": "policy", "preset_names": "policy", "read_op_list": "policy",
    "parse_dtype": "dtypes", "MptError": "errors", "ConfigError": "errors", "UserCodeError": "errors",
    "PlanMismatchError": "errors", "DeployError": "errors", "ModelInputs": "inputs",
    "Execution": "native", "ExecutionPath": "native", "autocast_failures": "deploy",
}
__all__ = list(_HOME)


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:  # a submodule, as `tuner.api` was reachable before
        try:
            return importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError:
            raise AttributeError(f"module 'tuner' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """Importing the submodule `tuner.tune` must not hide the function `tuner.tune` behind the module."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "tune" and isinstance(value, types.ModuleType):
            return  # the module stays in sys.modules["tuner.tune"]
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

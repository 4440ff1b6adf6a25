"""mpt-tuner: per-op precision policies for PyTorch, an accuracy-driven FP32 fallback search, inspection.

Data flow: model file (loader) -> policy/plan (policy, plan) -> engine (engine, api)
-> inspect (audit) / search (search, tune) -> outputs (outputs, checkpoint).
"""
from .api import attach, attached, autocast, convert, detach, revert
from .checkpoint import load
from .dtypes import parse_dtype
from .engine import Decision, disable_casts
from .deploy import autocast_failures
from .errors import ConfigError, DeployError, MptError, PlanMismatchError, UserCodeError
from .inputs import ModelInputs
from .native import Execution, ExecutionPath
from .plan import OpInstance, Plan
from .policy import Policy, load_preset, preset_names, read_op_list

from .tune import TuneOptions, TuneResult, tune
from .audit import inspect_model

__version__ = "0.1.0"

__all__ = [
    "autocast", "disable_casts", "convert", "revert", "attach", "detach", "attached", "Execution", "ExecutionPath", "load", "tune", "TuneOptions",
    "TuneResult", "inspect_model",
    "Plan", "OpInstance", "Policy", "Decision", "load_preset", "preset_names", "read_op_list", "parse_dtype",
    "MptError", "ConfigError", "UserCodeError", "PlanMismatchError", "DeployError", "ModelInputs",
    "autocast_failures",
]

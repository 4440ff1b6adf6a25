"""mpt-tuner: per-op precision policies for PyTorch, an accuracy-driven FP32 fallback search, inspection.

The data flow, one subpackage per stage; each imports only from those above it in this list:

    core      the user's model file, ModelInputs, dtypes, fingerprints, file IO, errors
    policy    what precision each op gets, as data: rules, presets, the Plan
    options   every command's options, defined once (and the YAML config schema)
    engine    running a model under a policy: function mode, native regions, attach
    measure   cost and error of a forward: FLOPs, shares, inspection, ranking
    workspace one run's on-disk state: output folder, lock, journal, model keeper
    search    the tune session: baseline, candidates, ranking, trials
    report    what a tune wrote: report, renderers, checkpoint, the writer
    jobs      whole commands as library calls: tune into a folder, check, inspect

The public names below load on first use, so `import tuner.core.errors` (what the CLI needs to start and
say something) does not import torch.
"""
import importlib as _importlib
import typing as _typing

from tuner.core.version import __version__

_HOME = {  # public name -> the module that defines it
    "autocast": "engine.attach", "convert": "engine.attach", "revert": "engine.attach",
    "attach": "engine.attach", "detach": "engine.attach", "attached": "engine.attach",
    "disable_casts": "engine.function_mode", "Decision": "engine.function_mode",
    "LossScaler": "engine.scaler", "StepsSkipped": "engine.scaler",
    "Execution": "engine.native", "ExecutionPath": "engine.native", "autocast_failures": "engine.probe",
    "load": "report.checkpoint", "tune": "jobs.tune_call", "TuneOptions": "options.tune",
    "TuneResult": "search.results", "inspect_model": "measure.inspection", "inspect": "jobs.inspect_run",
    "InspectOptions": "options.commands", "Plan": "policy.plan", "OpInstance": "policy.plan",
    "Policy": "policy.presets", "load_preset": "policy.presets",
    "preset_names": "policy.presetfiles", "read_op_list": "policy.presets", "parse_dtype": "core.dtypes",
    "MptError": "core.errors", "ConfigError": "core.errors", "UserCodeError": "core.errors",
    "PlanMismatchError": "core.errors", "DeployError": "core.errors", "ModelInputs": "core.inputs",
}
__all__ = ["__version__", *_HOME]


def __getattr__(name: str) -> _typing.Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'tuner' has no attribute {name!r}")
    value = getattr(_importlib.import_module(f"tuner.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)

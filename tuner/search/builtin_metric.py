"""`tuner.tune(build, metric="agreement", data=...)`: the built-in fidelity metric as the library's evaluate.

What `mpt tune --metric` does with a model file, for a notebook: the calibration batches are `data`
(a file, see tuner.core.calibration) or `example_inputs` (a list of batches, a function returning one,
or one batch); the FP32 reference lives in a temporary folder for the process.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from tuner.core.calibration import Calibration, data_file
from tuner.core.errors import ConfigError
from tuner.core.inputs import ModelInputs
from tuner.measure.fidelity import Metric
from tuner.options.tune import TuneOptions
from tuner.workspace.reference import FidelityEvaluate

__all__ = ["builtin_evaluate"]


def _batches(example_inputs: Any) -> Calibration:
    def make() -> Any:
        value = example_inputs() if callable(example_inputs) else example_inputs
        for batch in value if isinstance(value, list) else [value]:
            yield ModelInputs.of(batch)
    return Calibration(describe="example_inputs", digest="", make=make)


def builtin_evaluate(build: Callable[[], nn.Module], example_inputs: Any,
                     options: TuneOptions) -> tuple[FidelityEvaluate, Any]:
    """(evaluate, example inputs) for `options.metric`; ConfigError when there is nothing to run it on."""
    assert options.metric is not None
    if options.data is not None:
        batches = data_file(options.data, batch_size=options.batch_size, tokenizer=options.tokenizer)
    elif example_inputs is not None:
        batches = _batches(example_inputs)
    else:
        raise ConfigError("data: metric= needs calibration inputs: give data= (a .safetensors, .pt or .jsonl "
                          "file) or example_inputs (a list of batches)", fields=("data",))
    evaluate = FidelityEvaluate(Metric(options.metric), batches, build, output=options.output,
                                device=options.device, folder=None)
    return evaluate, batches.first

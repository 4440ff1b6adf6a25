"""The user's model as a command runs it: a model file or an `hf:` folder, with a built-in metric where asked.

Precedence, decided here once for `mpt tune`, `mpt check` and `mpt inspect`: `--metric` (or a metric a
plan records) replaces the model file's `evaluate`; without it the user's `evaluate` is the metric, and an
`hf:` folder, which has none, gets agreement (a class whose output is logits over a vocabulary or
classes) or cosine (an encoder, any other output) from the options (`hf_config.default_metric_name`).
The calibration batches come from, in order: `--data`, the file's `calibration_batches()`, its
`example_inputs()` (a list of batches, or one batch).
"""
from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner.core.calibration import Calibration, data_file, function_batches
from tuner.core.errors import ConfigError
from tuner.core.hf import hf_forward
from tuner.core.hf_config import is_encoder_decoder, vocab_size
from tuner.core.inputs import ModelInputs
from tuner.core.loader import DEFAULT_CALIBRATION, DEFAULT_INPUTS, UserModel, call_user, load_user_model
from tuner.measure.fidelity import Metric
from tuner.workspace.reference import FidelityEvaluate

__all__ = ["load_model", "FIDELITY_KEYS"]

FIDELITY_KEYS = ("metric", "output", "data", "tokenizer", "batch_size")


def _user_batches(user: UserModel) -> Calibration | None:
    if user.calibration_fn is not None:
        fn = user.calibration_fn
        return function_batches(lambda: call_user(fn, what=DEFAULT_CALIBRATION),
                                DEFAULT_CALIBRATION, lambda b: user.batch(b, DEFAULT_CALIBRATION))
    if user.inputs_fn is not None:
        fn = user.inputs_fn

        def several() -> list[Any]:
            value = call_user(fn, what=DEFAULT_INPUTS)
            return value if isinstance(value, list) else [value]
        return function_batches(several, DEFAULT_INPUTS, lambda b: user.batch(b, DEFAULT_INPUTS))
    return None


def calibration(user: UserModel, data: str | None, tokenizer: str | None, batch_size: int) -> Calibration | None:
    """The batches a built-in metric runs on (None: none given)."""
    if data is not None:
        return data_file(data, batch_size=batch_size, tokenizer=tokenizer or (str(user.path) if user.hf else None))
    return _user_batches(user)


def load_model(spec: str, *, specs: Mapping[str, str | None] | None = None, fidelity: Mapping[str, Any] | None = None,
               device: str = "cpu", folder: Path | None = None) -> UserModel:
    """Load `spec` (MODEL.py[:NAME] or hf:FOLDER) with its build/eval/inputs `specs`; with `fidelity["metric"]`
    its evaluate is the built-in metric (reference kept in `folder`, a temporary one when None).

    ConfigError (exit 2) when a metric has no calibration inputs, or an hf: model no --data.
    """
    given = dict(specs or {})
    record = dict(fidelity or {})
    metric = record.get("metric")
    user = load_user_model(spec, model=given.get("build"), eval=given.get("eval"), inputs=given.get("inputs"),
                           require_eval=metric is None)
    batches = calibration(user, record.get("data"), record.get("tokenizer"), int(record.get("batch_size") or 8))
    if batches is None and (metric is not None or user.hf):
        where = "" if user.hf else (f", a {DEFAULT_CALIBRATION}() function in {user.path.name}, or an "
                                    f"{DEFAULT_INPUTS}() returning a list of batches")
        raise ConfigError(f"data: {'an hf: model' if user.hf else '--metric'} needs calibration inputs: give "
                          f"--data FILE (.safetensors, .pt or .jsonl texts with --tokenizer){where}", fields=("data",))
    if batches is None:
        return user
    if record.get("data"):
        user = _with_data(user, batches, metric)
    files = user.files + ((Path(record["data"]).resolve(),) if record.get("data") else ())
    inputs_fn = user.inputs_fn if user.inputs_fn is not None else _first(batches)
    if metric is None:
        return dataclasses.replace(user, inputs_fn=inputs_fn, files=files)
    evaluate = FidelityEvaluate(Metric(metric), batches, user.build, output=record.get("output"), device=device,
                                folder=folder)
    return dataclasses.replace(user, eval_fn=evaluate, inputs_fn=inputs_fn, files=files)


def _with_data(user: UserModel, batches: Calibration, metric: str | None) -> UserModel:
    """`user` checking the data file's tensor names against its model's forward: an hf: folder's class now,
    before anything is built or written, any model once built (UserModel.build). The loss metrics of an
    encoder-decoder folder score the decoder's tokens, which the data must give as `labels`."""
    if user.hf and metric is not None and Metric(metric).scores_tokens and is_encoder_decoder(user.path) \
            and batches.names and "labels" not in batches.names:
        raise ConfigError(f"data: --metric {metric} of an encoder-decoder scores the decoder's tokens: "
                          f"{batches.describe} has no `labels` (the decoder's target token ids); add them",
                          fields=("data",))
    if user.hf:
        forward = hf_forward(user.path)
        if forward is not None:
            batches.check_forward(forward[0], owner=forward[1], strict=True)
        batches.check_token_ids(vocab_size(user.path), first=_first_argument(forward[0]) if forward else None)
    return dataclasses.replace(user, data=batches)


def _first_argument(forward: Any) -> str | None:
    """The name of `forward`'s first argument after self (what a batch of one tensor passes)."""
    try:
        params = [p for p in inspect.signature(forward).parameters.values() if p.name != "self"]
    except (TypeError, ValueError):
        return None
    return params[0].name if params else None


def _first(batches: Calibration) -> Any:
    def example_inputs() -> ModelInputs:
        return batches.first()
    return example_inputs

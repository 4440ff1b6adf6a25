"""`tuner.tune()`: the search from Python, with a progress display and, given `out=`, the CLI's outputs.

`tuner.search.session.tune` is the search alone (silent: it reports typed events); this adds what a notebook
or script user wants on top: progress as the CLI shows it (tuner.jobs.progress; `progress=False` for none)
and `out=FOLDER`, which writes the same files `mpt tune --out FOLDER` writes (plan.yaml, model.safetensors,
report.md, search.html, ...) through the same job (tuner.jobs.tune_run), so `tuner.load(build(), FOLDER)`
loads the result.
"""
from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from tuner.core.errors import ConfigError
from tuner.core.loader import UserModel
from tuner.jobs.progress import ProgressDisplay
from tuner.jobs.tune_run import tune_into_folder
from tuner.options.tune import TuneOptions
from tuner.search import session
from tuner.search.builtin_metric import builtin_evaluate
from tuner.search.results import TuneEvent, TuneResult

PYTHON_NAMES = {"resume": "resume=True", "overwrite": "overwrite=True"}  # the library's `key`s as tune() takes them


def tune(build: Callable[[], nn.Module] | nn.Module, evaluate: Callable[[nn.Module], Any] | None = None,
         example_inputs: Callable[[], Any] | Any = None, options: TuneOptions | None = None, *,
         out: str | Path | None = None, progress: bool = True, resume: bool = False, overwrite: bool = False,
         on_event: Callable[[TuneEvent], None] | None = None, **option_values: Any) -> TuneResult:
    """Find the op instances that must stay FP32 for `evaluate(model)` to stay within tolerance.

    `build` builds the FP32 model (or is the model: each trial then starts from a deep copy);
    `evaluate(model)` returns the metric; options as keywords (`dtype="bf16", tolerance=0.005`) or as
    `options=TuneOptions(...)` (tuner.search.session.tune says more). `progress=True` shows each trial as it
    ends, in a terminal or a notebook. `out` writes the CLI's outputs into that folder (`resume`/`overwrite`
    as `mpt tune --resume/--overwrite`). `on_event` receives the progress events as well.
    """
    display = ProgressDisplay() if progress else None

    def emit(event: TuneEvent) -> None:
        if display is not None:
            display(event)
        if on_event is not None:
            on_event(event)

    try:
        if out is None:
            result = session.tune(build, evaluate, example_inputs, options, on_event=emit, **option_values)
        else:
            opts = session.tune_options(options, option_values)
            try:
                result = tune_into_folder(_user_model(build, evaluate, example_inputs, opts), opts, out,
                                          resume=resume, overwrite=overwrite, on_event=emit).result
            except ConfigError as exc:  # "pass `overwrite` ...": the keywords as this call spells them
                raise exc.respelled(PYTHON_NAMES) from None
        if display is not None:
            display.finish(result)
        return result
    finally:
        if display is not None:
            display.close()


def _user_model(build: Callable[[], nn.Module] | nn.Module, evaluate: Callable[[nn.Module], Any] | None,
                example_inputs: Any, options: TuneOptions) -> UserModel:
    """The functions as the CLI's loader would give them; the file that defines `build` (or the model's
    class) is the plan's model file, so `mpt check` can find it, unless there is no such file to import
    (`_model_file`): the plan then records none, and `mpt check` asks for one. A built-in
    `metric=` is the evaluate when named (its FP32 reference is then kept in memory, not in `out`)."""
    if isinstance(build, nn.Module):
        template = build
        build_fn: Callable[[], nn.Module] = lambda: copy.deepcopy(template)  # noqa: E731
        defined_by: Any = type(template)
    else:
        build_fn = defined_by = build
    if options.metric is not None:
        evaluate, example_inputs = builtin_evaluate(build_fn, example_inputs, options)
    elif evaluate is None:
        raise TypeError("tune(..., out=...) needs evaluate(model) -> metric, or metric= with data= or "
                        "example_inputs")
    inputs_fn = example_inputs if callable(example_inputs) or example_inputs is None else (lambda: example_inputs)
    source = _model_file(defined_by)
    if source is None:
        return UserModel(path=Path.cwd(), build_fn=build_fn, eval_fn=evaluate, inputs_fn=inputs_fn, no_file=True)
    return UserModel(path=source, build_fn=build_fn, eval_fn=evaluate, inputs_fn=inputs_fn, files=(source,))


def _model_file(obj: Any) -> Path | None:
    """The file that defines `obj`, which `mpt check` imports to rebuild the model; None when there is none
    to import: `obj` was defined in a notebook cell, an interactive session or a script run as `__main__`
    (importing that script would run all of it again, this tune included)."""
    if getattr(obj, "__module__", None) == "__main__":
        return None
    try:
        found = inspect.getsourcefile(obj)
    except TypeError:
        found = None
    return Path(found).resolve() if found and Path(found).is_file() else None

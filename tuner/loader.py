"""Loading the user's model file: `model.py` or `model.py:build_fn`, like uvicorn's `module:attr`.

The file defines build_model() -> nn.Module, evaluate(model) -> float and
optionally example_inputs(). Problems in finding the code are ConfigError
(bad usage); exceptions raised by the user's code are UserCodeError, pointing
at the user's own file and line.
"""
from __future__ import annotations

import importlib.util
import itertools
import math
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import torch
from torch import nn

from .errors import ConfigError, UserCodeError

_COUNTER = itertools.count()


def _user_frame(exc: BaseException, files: set[str]) -> str | None:
    """file.py:LINE of the innermost traceback frame inside one of the user's files."""
    where = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if str(Path(frame.filename).resolve()) in files:
            where = f"{Path(frame.filename).name}:{frame.lineno}"
    if where is None and isinstance(exc, SyntaxError) and exc.filename:
        where = f"{Path(exc.filename).name}:{exc.lineno}"
    return where


_USER_FILES: set[str] = set()


def call_user(fn: Callable[..., Any], *args: Any, what: str, **kwargs: Any) -> Any:
    """Run user code; any Exception becomes a one-line UserCodeError naming the user's frame."""
    try:
        return fn(*args, **kwargs)
    except (KeyboardInterrupt, SystemExit):
        raise
    except UserCodeError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's code may raise anything
        first = (str(exc).strip().splitlines() or [""])[0]
        msg = f"{what} raised {type(exc).__name__}" + (f": {first}" if first else "")
        raise UserCodeError(msg, where=_user_frame(exc, _USER_FILES), original=exc) from None


def _import_file(path: Path) -> ModuleType:
    if not path.exists():
        raise ConfigError(f"model file not found: {path}")
    if path.is_dir():
        raise ConfigError(f"{path} is a folder; expected a Python file (model.py)")
    if path.suffix != ".py":
        raise ConfigError(f"{path} is not a Python file (expected a .py file)")
    resolved = str(path.resolve())
    _USER_FILES.add(resolved)
    name = f"mpt_user_{path.stem}_{next(_COUNTER)}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(name, None)
        raise UserCodeError(f"{path.name} is not valid Python: {exc.msg}",
                            where=f"{path.name}:{exc.lineno}", original=exc) from None
    except UnicodeDecodeError as exc:
        sys.modules.pop(name, None)
        raise ConfigError(f"{path} is not a text Python file") from None
    except (KeyboardInterrupt, SystemExit):
        sys.modules.pop(name, None)
        raise
    except Exception as exc:  # noqa: BLE001
        sys.modules.pop(name, None)
        first = (str(exc).strip().splitlines() or [""])[0]
        raise UserCodeError(f"importing {path.name} raised {type(exc).__name__}" + (f": {first}" if first else ""),
                            where=_user_frame(exc, _USER_FILES), original=exc) from None
    finally:
        try:
            sys.path.remove(folder)
        except ValueError:
            pass
    return module


def _split(spec: str) -> tuple[str, str | None]:
    if ":" in spec and not (len(spec) > 1 and spec[1] == ":" and spec.count(":") == 1):  # keep C:\\ paths
        file, _, attr = spec.rpartition(":")
        return file, attr or None
    return spec, None


def _lookup(module: ModuleType, attr: str, path: Path, role: str) -> Callable[..., Any]:
    if not hasattr(module, attr):
        found = sorted(n for n, v in vars(module).items()
                       if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == module.__name__)
        hint = f"; found: {', '.join(found)}" if found else ""
        raise ConfigError(f"{path.name} has no function {attr!r} ({role}){hint}")
    fn = getattr(module, attr)
    if not callable(fn):
        raise ConfigError(f"{path.name}: {attr!r} is a {type(fn).__name__}, not a function ({role})")
    return fn


def _as_float(value: Any) -> float:
    if isinstance(value, bool):
        raise UserCodeError(f"evaluate returned a bool ({value}); expected a number")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise UserCodeError(f"evaluate returned a tensor with {value.numel()} elements; expected one number")
        return float(value.detach().cpu().item())
    if hasattr(value, "item") and getattr(value, "size", 1) == 1 and not isinstance(value, (str, bytes)):
        try:
            return float(value.item())  # numpy scalars and 1-element arrays
        except (TypeError, ValueError):
            pass
    raise UserCodeError(f"evaluate returned {type(value).__name__} {value!r:.40}; expected a number")


@dataclass(frozen=True)
class UserModel:
    path: Path
    build_fn: Callable[[], Any]
    eval_fn: Callable[[Any], Any] | None
    inputs_fn: Callable[[], Any] | None

    def build(self) -> nn.Module:
        model = call_user(self.build_fn, what=f"{getattr(self.build_fn, '__name__', 'build_model')}()")
        if not isinstance(model, nn.Module):
            raise UserCodeError(f"{getattr(self.build_fn, '__name__', 'build_model')} returned "
                                f"{type(model).__name__}, expected a torch.nn.Module")
        return model

    def evaluate(self, model: nn.Module) -> float:
        if self.eval_fn is None:
            raise ConfigError(f"{self.path.name} defines no evaluate(model)")
        value = call_user(self.eval_fn, model, what=f"{getattr(self.eval_fn, '__name__', 'evaluate')}(model)")
        return _as_float(value)

    def example_inputs(self) -> tuple | None:
        if self.inputs_fn is None:
            return None
        value = call_user(self.inputs_fn, what=f"{getattr(self.inputs_fn, '__name__', 'example_inputs')}()")
        if isinstance(value, tuple):
            return value
        if isinstance(value, list):
            return tuple(value)
        return (value,)  # a single tensor or dict is one positional argument


def load_user_model(spec: str, *, model: str | None = None, eval: str | None = None,  # noqa: A002
                    inputs: str | None = None, require_eval: bool = True) -> UserModel:
    """Import `spec` (`file.py` or `file.py:build_fn`) and find build_model/evaluate/example_inputs.

    `model`, `eval`, `inputs` override the function names: `name` (same file)
    or `other.py:name`.
    """
    file, build_attr = _split(spec)
    path = Path(file)
    module = _import_file(path)
    modules: dict[str, ModuleType] = {str(path.resolve()): module}

    def resolve(ref: str | None, default: str, role: str, required: bool) -> Callable[..., Any] | None:
        if ref is None:
            if not required and not hasattr(module, default):
                return None
            return _lookup(module, default, path, role)
        other_file, attr = _split(ref)
        if attr is None:  # a bare name in the same file
            return _lookup(module, other_file, path, role)
        other = Path(other_file)
        key = str(other.resolve())
        if key not in modules:
            modules[key] = _import_file(other)
        return _lookup(modules[key], attr, other, role)

    build_ref = model if model is not None else build_attr
    build_fn = resolve(build_ref, "build_model", "the model builder", True)
    eval_fn = resolve(eval, "evaluate", "the metric", require_eval)
    inputs_fn = resolve(inputs, "example_inputs", "example inputs", inputs is not None)
    assert build_fn is not None
    return UserModel(path=path, build_fn=build_fn, eval_fn=eval_fn, inputs_fn=inputs_fn)


__all__ = ["UserModel", "load_user_model", "call_user"]

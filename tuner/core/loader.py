"""Load the user's model file: `build_model()`, `evaluate(model)` and optionally `example_inputs()`.

The file is imported by path (not by module name) so `mpt tune path/to/model.py`
works from any directory, and every call into it goes through `call_user`, so
a failure in user code becomes a one-line UserCodeError pointing at the
user's file and line rather than a traceback through torch and mpt.
"""
from __future__ import annotations

import ast
import contextlib
import functools
import importlib.util
import inspect
import itertools
import numbers
import os
import re
import site
import sys
import sysconfig
import threading
import traceback
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tuner.core.calibration import Calibration
from tuner.core.errors import ConfigError, UserCodeError
from tuner.core.hf import build_hf_model, offline_transformers
from tuner.core.hf_config import HF_PREFIX, hf_files, hf_folder
from tuner.core.inputs import ModelInputs
from tuner.core.memory import is_out_of_memory, out_of_memory
from tuner.core.output_files import PLAN_NAME
from tuner.core.yamlio import load_yaml_file

__all__ = ["UserModel", "load_user_model", "call_user", "call_forward", "imported_user_files", "DEFAULT_BUILD",
           "DEFAULT_EVAL", "DEFAULT_INPUTS", "DEFAULT_CALIBRATION"]

DEFAULT_BUILD = "build_model"
DEFAULT_EVAL = "evaluate"
DEFAULT_INPUTS = "example_inputs"
DEFAULT_CALIBRATION = "calibration_batches"

_MAX_MESSAGE = 300

# Files loaded by this module: a traceback frame in one of them is "the user's" (torch's and ours are not).
_user_files: set[str] = set()
_counter = itertools.count(1)
_lock = threading.Lock()


@dataclass(frozen=True)
class UserModel:
    """The user's functions, each wrapped so that its failures and bad return values become UserCodeError.

    `eval_fn` is None only when loaded with `require_eval=False` from a file
    without an evaluate function; `inputs_fn` is None when there is no
    example_inputs function. `files` are the user's files that were imported
    (the model file first), and every user file they import in turn (a
    sibling `metric.py`, a package of the user's: `imported_user_files`):
    what a journal or plan fingerprints as its source. `data` is the `--data` file the model runs on, whose
    tensor names `build` checks against the built model's forward (bad input, not an error in the user's code).
    `no_file`: the functions come from `tuner.tune()` in a notebook or a script's `__main__`, with no model file
    `mpt check` could import (`path` is then the working directory).
    """

    path: Path
    build_fn: Callable[[], Any]
    eval_fn: Callable[[Any], Any] | None
    inputs_fn: Callable[[], Any] | None
    files: tuple[Path, ...] = ()
    calibration_fn: Callable[[], Any] | None = None
    hf: bool = False  # `path` is a Hugging Face model folder (`hf:PATH`), not a model file
    data: Calibration | None = None
    no_file: bool = False

    def build(self) -> torch.nn.Module:
        name = _fn_name(self.build_fn, DEFAULT_BUILD)
        # mpt's own builder (hf:): a folder it cannot load is bad input (exit 2), not an error in the user's code
        model = self.build_fn() if getattr(self.build_fn, "mpt_builtin", False) else call_user(self.build_fn, what=name)
        if not isinstance(model, torch.nn.Module):
            raise UserCodeError(f"{name} returned {_describe(model)}, expected a torch.nn.Module",
                                where=_definition_site(self.build_fn))
        meta = _meta_tensors(model)
        if meta:
            raise UserCodeError(f"{name} returned a model on the meta device ({meta}): its weights are not "
                                "materialized; load or initialize them before returning it",
                                where=_definition_site(self.build_fn))
        scripted = next((path or "the model itself" for path, m in model.named_modules()
                         if isinstance(m, torch.jit.ScriptModule)), None)
        if scripted is not None:
            raise ConfigError(f"{name} returned a model holding a torch.jit.script module ({scripted}), which mpt "
                              "cannot tune (no hooks, no autocast inside it): return the eager module, and script "
                              "the tuned model after tuner.load if you need to")
        if self.data is not None:
            self.data.check_forward(model.forward, owner=f"{type(model).__name__}.forward", strict=self.hf)
        return model

    def evaluate(self, model: Any) -> float:
        """The metric as a float; NaN and inf are returned as is, since only the caller knows if they are fatal."""
        if self.eval_fn is None:
            raise ConfigError(f"{self.path.name} has no function '{DEFAULT_EVAL}'")
        name = _fn_name(self.eval_fn, DEFAULT_EVAL)
        if getattr(self.eval_fn, "mpt_builtin", False):  # mpt's own metric: its errors are mpt's (bad --output: exit 2)
            return float(self.eval_fn(model))
        value = call_user(self.eval_fn, model, what=name)
        metric = _to_float(value)
        if metric is None:
            hint = " (missing `return`?)" if value is None else ""
            raise UserCodeError(f"{name} returned {_describe(value)}, expected a single number{hint}",
                                where=_definition_site(self.eval_fn))
        return metric

    def example_inputs(self) -> ModelInputs | None:
        """One forward call's arguments: a tuple is positional args, a dict with str keys keyword args
        (HF style, `model(**inputs)`), a lone tensor the only argument."""
        if self.inputs_fn is None:
            return None
        name = _fn_name(self.inputs_fn, DEFAULT_INPUTS)
        value = call_user(self.inputs_fn, what=name)
        if isinstance(value, list) and value:  # several batches: the first is the example
            return self.batch(value[0], name)
        return self.batch(value, name)

    def batch(self, value: Any, name: str) -> ModelInputs:
        """One forward call's arguments from what a user function returned (see example_inputs)."""
        fn = self.calibration_fn if name == DEFAULT_CALIBRATION else self.inputs_fn
        if isinstance(value, (tuple, torch.Tensor, ModelInputs)):
            return ModelInputs.of(value)
        if isinstance(value, Mapping):
            bad = [k for k in value if not isinstance(k, str)]
            if not bad:
                return ModelInputs.of(value)
            raise UserCodeError(f"{name} returned a dict with key {bad[0]!r}; a dict's keys are the forward's "
                                "keyword argument names (str)", where=_definition_site(fn))
        hint = " (use tuple(...) for positional args, or (x,) for one list argument)" if isinstance(value, list) else ""
        raise UserCodeError(f"{name} returned {_describe(value)}, expected a tuple of positional args, "
                            f"a dict of keyword args or a tensor{hint}", where=_definition_site(fn))


def load_user_model(spec: str, *, model: str | None = None, eval: str | None = None,  # noqa: A002
                    inputs: str | None = None, require_eval: bool = True) -> UserModel:
    """Import `spec` (`path.py` or `path.py:build_fn`) and pick its functions.

    `model`, `eval` and `inputs` override the function names: `name` looks in
    the same file, `other.py:name` (or `other.py`, for the default name) in
    another file, relative to the working directory or else to the model
    file's folder. A default-named function that is absent is an error only
    for build_model (and evaluate when `require_eval`); a name the user gave
    must exist.
    """
    if spec.startswith("hf:"):
        return _load_hf(spec, model=model, eval=eval, inputs=inputs)
    path_text, build_name = _split_spec(spec)
    path = _check_file(path_text, "model file")
    if build_name is not None and model is not None and model != build_name:
        raise ConfigError(f"the build function is given twice ({spec!r} and {model!r}); give one")
    before = set(sys.modules)
    modules: dict[Path, types.ModuleType] = {path: _import_file(path)}

    build_fn = _pick(model if model is not None else build_name, DEFAULT_BUILD, "model", path, modules, True)
    eval_fn = _pick(eval, DEFAULT_EVAL, "eval", path, modules, require_eval)
    inputs_fn = _pick(inputs, DEFAULT_INPUTS, "inputs", path, modules, False)
    calibration_fn = _pick(None, DEFAULT_CALIBRATION, "calibration", path, modules, False)
    assert build_fn is not None
    fresh = [m for name, m in list(sys.modules.items()) if name not in before and isinstance(m, types.ModuleType)]
    files = imported_user_files([*modules.values(), *fresh])
    return UserModel(path=path, build_fn=build_fn, eval_fn=eval_fn, inputs_fn=inputs_fn,
                     files=(*modules, *(f for f in files if f not in modules)), calibration_fn=calibration_fn)


def _load_hf(spec: str, **functions: str | None) -> UserModel:
    """A UserModel for `hf:PATH`: built from the folder; no evaluate or inputs of the user's (mpt brings them)."""
    given = [role for role, name in functions.items() if name is not None]
    if given:
        raise ConfigError(f"{given[0]}: an hf: model has no model file to take functions from; drop --{given[0]}")
    folder = hf_folder(spec)
    offline_transformers()  # not installed: said now, before any output folder is claimed
    build = functools.partial(build_hf_model, folder)
    build.mpt_builtin = True  # type: ignore[attr-defined]
    return UserModel(path=folder, build_fn=build, eval_fn=None, inputs_fn=None, files=hf_files(folder), hf=True)


# --- the user's files a model file depends on -----------------------------------------------------------------

MAX_USER_FILES = 5000  # a bound on the walk below (a source checkout of a large library is about this size)


@functools.lru_cache(maxsize=1)
def _library_dirs() -> tuple[str, ...]:
    """Folders whose files are not the user's: the standard library, site-packages, torch and mpt itself."""
    dirs = {os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
            os.path.dirname(os.__file__)}
    for scheme_vars in ({}, {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}):
        paths = sysconfig.get_paths(vars=scheme_vars) if scheme_vars else sysconfig.get_paths()
        dirs.update(paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths)
    try:
        dirs.update(site.getsitepackages())
        dirs.add(site.getusersitepackages())
    except AttributeError:  # pragma: no cover - a virtualenv's old site module
        pass
    return tuple(sorted({_norm(d) + os.sep for d in dirs if d}))


def _user_file(module: types.ModuleType) -> Path | None:
    """The module's .py file when it is the user's (not the standard library's, a package's, torch's or mpt's)."""
    file = getattr(module, "__file__", None)
    if not isinstance(file, str) or not file.endswith(".py") or not os.path.isfile(file):
        return None
    norm = _norm(file)
    return None if norm.startswith(_library_dirs()) else Path(norm)


def _referenced_modules(module: types.ModuleType) -> Iterator[types.ModuleType]:
    """The modules a module's namespace refers to: imported modules, and the modules that define the
    functions, classes and objects it imported from them (`from metric import score`), and its parent
    packages (whose `__init__.py` ran when it was imported)."""
    name = getattr(module, "__name__", "")
    while isinstance(name, str) and "." in name:
        name = name.rsplit(".", 1)[0]
        parent = sys.modules.get(name)
        if isinstance(parent, types.ModuleType):
            yield parent
    for imported in _import_statements(module):
        found = sys.modules.get(imported)
        if isinstance(found, types.ModuleType):
            yield found
    for value in list(vars(module).values()):
        if isinstance(value, types.ModuleType):
            yield value
            continue
        name = getattr(value, "__module__", None) if isinstance(value, (type, types.FunctionType)) \
            else getattr(type(value), "__module__", None)
        found = sys.modules.get(name) if isinstance(name, str) else None
        if isinstance(found, types.ModuleType):
            yield found


def _import_statements(module: types.ModuleType) -> list[str]:
    """The module names the module's source imports (`import a.b`, `from .c import d`, in function bodies
    too): a constant imported from a module (`from helper import scale`) leaves no trace in the namespace."""
    try:
        tree = ast.parse(Path(module.__file__ or "").read_bytes())
    except (OSError, SyntaxError, ValueError):
        return []
    package = getattr(module, "__package__", None) or ""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                parts = parts[:len(parts) - node.level + 1] if node.level <= len(parts) else []
                base = ".".join(p for p in (*parts, base) if p)
            if base:
                names.append(base)
                names += [f"{base}.{alias.name}" for alias in node.names]  # `from pkg import submodule`
    return names


def imported_user_files(roots: Iterable[types.ModuleType]) -> list[Path]:
    """The user's files among `roots` and every user module they refer to, transitively, in the order found.

    A module counts as the user's when its file is outside the standard library, site-packages, torch
    and mpt: a sibling `metric.py` the model file imports, a package of the user's (installed editable or
    on sys.path). What one imports only inside a function body, and has not imported yet, is not seen.
    """
    files: list[Path] = []
    seen: set[int] = set()
    stack = list(roots)[::-1]
    while stack and len(files) < MAX_USER_FILES:
        module = stack.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        file = _user_file(module)
        if file is None:
            continue
        if file not in files:
            files.append(file)
        stack.extend(reversed(list(_referenced_modules(module))))
    return files


def call_user(fn: Callable[..., Any], *args: Any, what: str, **kwargs: Any) -> Any:
    """Run user code; any Exception becomes UserCodeError("<what> raised Type: msg") at the user's line.

    KeyboardInterrupt passes through, and so does a UserCodeError from a nested
    call, which already says where. `sys.exit()` in user code is an error too:
    it would otherwise end mpt silently with the user's exit code.
    """
    return _run_user(fn, args, kwargs, what=what, own=_source_file(fn))


def call_forward(model: Any, inputs: ModelInputs | tuple, *, what: str = "forward") -> Any:
    """`model(*args, **kwargs)` with call_user's semantics: a failure is a UserCodeError at the user's line.

    `inputs` is a ModelInputs or a tuple of positional args (ModelInputs.of).

    The user's files are those load_user_model imported plus the file that
    defines the model's forward, unless that is torch's own (nn.Sequential):
    a frame inside torch is never "the user's line".
    """
    forward = getattr(type(model), "forward", None)
    own = _source_file(forward) if forward is not None else None
    if own is not None and own.startswith(_TORCH_DIR):
        own = None
    call = ModelInputs.of(inputs)
    return _run_user(model, call.args, dict(call.kwargs), what=what, own=own)


def _run_user(fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any], *, what: str, own: str | None) -> Any:
    try:
        return fn(*args, **kwargs)
    except UserCodeError:
        raise
    except (Exception, SystemExit) as exc:
        files = set(_user_files)
        if own:
            files.add(own)
        summary = f"called sys.exit({exc.code!r})" if isinstance(exc, SystemExit) else f"raised {_exc_summary(exc)}"
        error = UserCodeError(f"{what} {summary}", where=_user_frame(exc, files), original=exc)
        if is_out_of_memory(exc):  # not a bug in the user's code: the one out-of-memory error
            raise out_of_memory(error, f"running {what}") from exc
        raise error from exc


# --- spec parsing and import -------------------------------------------------------------------------------

def _split_spec(spec: str) -> tuple[str, str | None]:
    """`path.py:name` -> (path, name); a colon that is part of the path (C:\\...) is left alone."""
    head, sep, tail = spec.rpartition(":")
    if not sep or not (tail.isidentifier() or head.lower().endswith(".py")):
        return spec, None
    if not tail.isidentifier():
        raise ConfigError(f"{tail!r} in {spec!r} is not a valid function name")
    if not head:
        raise ConfigError(f"missing file name before ':' in {spec!r}")
    return head, tail


def _check_file(path_text: str, label: str, *, base: Path | None = None) -> Path:
    path = Path(path_text).expanduser()
    if not path.is_absolute() and not path.exists() and base is not None and (base / path).exists():
        path = base / path
    if not path.exists():
        raise ConfigError(f"{label} not found: {path_text}")
    if path.is_dir():
        raise ConfigError(_folder_given(path, path_text, label))
    if path.suffix != ".py":
        raise ConfigError(f"{label} must be a Python .py file: {path_text}")
    path = path.resolve()
    try:
        head = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {label} {path_text}: {exc.strerror or exc}") from exc
    if b"\x00" in head:
        raise ConfigError(f"{label} is not Python source (it contains NUL bytes): {path_text}")
    return path


def _folder_given(path: Path, path_text: str, label: str) -> str:
    """What to say for a folder given as a model file: the fix, where the folder tells it. A folder saved with
    save_pretrained (config.json) is run as `hf:DIR`; the output folder of a tune (plan.yaml) is a plan, which
    `mpt inspect MODEL --plan DIR` applies to the model file the plan records."""
    if (path / "config.json").is_file():
        return (f"{label} is a directory, expected a .py file: {path_text} holds config.json; for a folder "
                f"saved with save_pretrained pass hf:{path_text}")
    if (path / PLAN_NAME).is_file():
        return (f"{path_text} is the output folder of mpt tune (it holds {PLAN_NAME}), not a model file; "
                f"inspect the model under its plan with: mpt inspect {_recorded_model(path)} --plan {path_text}")
    return f"{label} is a directory, expected a .py file: {path_text}"


def _recorded_model(out: Path) -> str:
    """The model the plan in `out` records, as a path from the working directory (`MODEL.py` when it records
    none or cannot be read): plan.yaml names it relative to its own folder."""
    try:
        model = load_yaml_file(out / PLAN_NAME).get("model") or {}
        file, build = str(model["file"]), model.get("build")
    except (ConfigError, AttributeError, KeyError, TypeError):
        return "MODEL.py"
    if file.startswith(HF_PREFIX):
        return HF_PREFIX + os.path.relpath(os.path.normpath(out / file[len(HF_PREFIX):]))
    path = os.path.relpath(os.path.normpath(out / file))
    return f"{path}:{build}" if isinstance(build, str) and build.isidentifier() else path


def _import_file(path: Path) -> types.ModuleType:
    """Import one file under a fresh module name, with its folder first on sys.path so its siblings import."""
    stem = re.sub(r"\W", "_", path.stem)
    with _lock:
        name = f"_mpt_user_{stem}_{next(_counter)}"
        _user_files.add(_norm(str(path)))
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:  # pragma: no cover - .py files always get a loader
        raise ConfigError(f"cannot import {path.name}")
    module = importlib.util.module_from_spec(spec)
    folder = str(path.parent)
    sys.modules[name] = module  # dataclasses and pickle look the module up by name
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(name, None)
        raise _syntax_error(exc, path) from exc
    except UserCodeError:
        sys.modules.pop(name, None)
        raise
    except Exception as exc:
        sys.modules.pop(name, None)
        raise UserCodeError(f"importing {path.name} raised {_exc_summary(exc)}",
                            where=_user_frame(exc, {_norm(str(path))}), original=exc) from exc
    except BaseException:
        sys.modules.pop(name, None)
        raise
    finally:
        try:
            sys.path.remove(folder)
        except ValueError:  # the user's file removed it itself
            pass
    return module


def _syntax_error(exc: SyntaxError, path: Path) -> UserCodeError:
    bad = Path(exc.filename) if exc.filename and os.path.exists(exc.filename) else path
    where = f"{bad.name}:{exc.lineno}" if exc.lineno else bad.name
    prefix = "" if _norm(str(bad)) == _norm(str(path)) else f"importing {path.name}: "
    return UserCodeError(f"{prefix}{bad.name} is not valid Python: {_one_line(exc.msg or str(exc))}",
                         where=where, original=exc)


def _pick(given: str | None, default: str, role: str, path: Path, modules: dict[Path, types.ModuleType],
          required: bool) -> Callable[..., Any] | None:
    """Resolve `name` or `file.py:name` (or `file.py`) to a callable; None if optional and absent."""
    if given is None:
        file, name, explicit = path, default, False
    else:
        if ":" in given or given.lower().endswith(".py"):
            file_text, name_or_none = _split_spec(given)
            if name_or_none is None and not file_text.lower().endswith(".py"):
                raise ConfigError(f"{given!r} ({role}) is neither a function name nor FILE.py:NAME")
            file = _check_file(file_text, f"{role} file", base=path.parent)
            name = name_or_none or default
        elif given.isidentifier():
            file, name = path, given
        else:
            raise ConfigError(f"{given!r} ({role}) is not a valid function name or FILE.py:NAME")
        explicit = True
    module = modules.get(file)
    if module is None:
        module = modules[file] = _import_file(file)
    if not hasattr(module, name):
        if not explicit and not required:
            return None
        found = _defined_callables(module)
        listing = ", ".join(found[:12]) + (", ..." if len(found) > 12 else "") if found else "no functions"
        raise ConfigError(f"{file.name} has no function '{name}'; found: {listing}")
    obj = getattr(module, name)
    if not callable(obj):
        raise ConfigError(f"{file.name}: '{name}' is {_describe(obj)}, not a function")
    return obj


def _defined_callables(module: types.ModuleType) -> list[str]:
    """Public functions and classes defined in the module itself (not imported ones), in definition order."""
    return [k for k, v in vars(module).items()
            if not k.startswith("_") and callable(v) and getattr(v, "__module__", None) == module.__name__]


# --- locating and describing failures ------------------------------------------------------------------------

def _norm(filename: str) -> str:
    return os.path.normcase(os.path.realpath(filename))


_TORCH_DIR = _norm(os.path.dirname(torch.__file__)) + os.sep


def _meta_tensors(model: torch.nn.Module) -> str:
    """'' when every parameter and buffer holds data, else which ones are on the meta device."""
    tensors = [*model.named_parameters(), *model.named_buffers()]
    meta = [name for name, t in tensors if t.is_meta]
    if not meta:
        return ""
    if len(meta) == len(tensors):
        return "all its tensors"
    return f"{len(meta)} of {len(tensors)} tensors, e.g. {meta[0]!r}"


def _user_frame(exc: BaseException, files: set[str]) -> str | None:
    """`file.py:LINE` of the innermost traceback frame in one of `files`."""
    where = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename and not frame.filename.startswith("<") and _norm(frame.filename) in files:
            where = f"{os.path.basename(frame.filename)}:{frame.lineno}"
    return where


def raised_at(exc: BaseException) -> str | None:
    """`file.py:LINE` of the innermost traceback frame that is the model's code, not torch's, mpt's or the
    standard library's: the call that raised, in the user's file or in a library model's (transformers'
    modeling file). None when every frame is torch's or mpt's."""
    skip = (_TORCH_DIR, _norm(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep,
            _norm(os.path.dirname(os.__file__)) + os.sep)
    where = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename and not frame.filename.startswith("<") and not _norm(frame.filename).startswith(skip):
            where = f"{os.path.basename(frame.filename)}:{frame.lineno}"
    return where


def _source_file(fn: Any) -> str | None:
    """The file a callable was defined in, through partials, bound methods and decorators."""
    for _ in range(10):
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        elif hasattr(fn, "__func__"):
            fn = fn.__func__
        else:
            break
    code = getattr(fn, "__code__", None)
    if code is None:
        call = getattr(type(fn), "__call__", None)  # noqa: B004 - the method itself, for its code
        code = getattr(call, "__code__", None)
    return _norm(code.co_filename) if code is not None and not code.co_filename.startswith("<") else None


def user_site(fn: Any) -> str | None:
    """`file.py:line` where the user's function behind `fn` is defined: a UserModel's `build`/`evaluate`
    stand for the model file's functions. None for code that is not in a file."""
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, UserModel):
        fn = {"build": owner.build_fn, "evaluate": owner.eval_fn}.get(getattr(fn, "__name__", ""), fn)
    return _definition_site(fn)


def _definition_site(fn: Any) -> str | None:
    """Where `fn` is defined; a decorated function (`@torch.no_grad()`, functools.wraps) is followed to the
    function it wraps, which is the user's, not to the decorator's wrapper in torch's or functools' files."""
    with contextlib.suppress(ValueError):  # a cycle of __wrapped__: the outer one
        fn = inspect.unwrap(fn)
    code = getattr(fn, "__code__", None)
    if code is None or code.co_filename.startswith("<"):
        return None
    return f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}"


def _fn_name(fn: Any, default: str) -> str:
    name = getattr(fn, "__name__", None)
    return name if isinstance(name, str) and name != "<lambda>" else default


def _one_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    if not lines:
        return ""
    first = lines[0] + (" [...]" if len(lines) > 1 else "")
    return first if len(first) <= _MAX_MESSAGE else first[:_MAX_MESSAGE - 3] + "..."


def _exc_summary(exc: BaseException) -> str:
    msg = _one_line(str(exc))
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


def _describe(value: Any) -> str:
    """Name what a user function returned, briefly: `None`, `str ('abc')`, `a tensor with 2 elements (shape [2])`."""
    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        return f"a tensor with {value.numel()} elements (shape {list(value.shape)}, {value.dtype})"
    if hasattr(value, "shape") and hasattr(value, "size") and isinstance(value.size, int):
        return f"an array with {value.size} elements (shape {list(value.shape)})"
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return f"{type(value).__name__} ({_one_line(shown)})"


def _to_float(value: Any) -> float | None:
    """A single real number as float (NaN/inf kept); None for anything else (bool included, since it is a bug)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_complex() or value.dtype == torch.bool:
            return None
        return float(value.detach().reshape(()).item())
    size = getattr(value, "size", None)
    if isinstance(size, int) and hasattr(value, "item") and hasattr(value, "shape"):  # numpy scalar or array
        if size != 1:
            return None
        value = value.item()
    if isinstance(value, bool):
        return None
    return float(value) if isinstance(value, numbers.Real) else None

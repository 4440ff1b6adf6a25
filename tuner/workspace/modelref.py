"""Which model a plan was made for: the `ModelRef` a tune writes into plan.yaml, and its resolution for check.

Paths in a ModelRef are relative to the plan's folder, so a committed folder
keeps pointing at the model file wherever the repository is checked out; a
file with no common ancestor besides the root stays absolute.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.core.errors import ConfigError
from tuner.core.fingerprint import source_digest, structure_digest, weights_digest
from tuner.core.loader import DEFAULT_BUILD
from tuner.policy.plan import ModelRef

if TYPE_CHECKING:
    import torch

    from tuner.core.loader import UserModel

__all__ = ["model_ref_for", "resolve_model_ref", "resolve_plan_path"]

FUNCTION_ROLES = ("build", "eval", "inputs")


def _relative_to(path: Path, folder: Path) -> str:
    """`path` relative to `folder` when they share more than the file-system root, else absolute (posix)."""
    path, folder = path.resolve(), folder.resolve()
    if os.path.commonpath([str(path), str(folder)]) == path.anchor:
        return path.as_posix()
    return Path(os.path.relpath(path, folder)).as_posix()


def _split(spec: str) -> tuple[str, str]:
    """`FILE.py:NAME` -> (FILE.py, NAME); `FILE.py` -> (FILE.py, ""); a bare NAME -> ("", NAME)."""
    head, sep, tail = spec.rpartition(":")
    if sep and head.lower().endswith(".py"):
        return head, tail
    return (spec, "") if spec.lower().endswith(".py") else ("", spec)


def _spec_file(spec: str, model_path: Path) -> Path | None:
    """The file a function spec names, found the way the loader finds it: the working dir, else the model's."""
    file_text, _ = _split(spec)
    if not file_text:
        return None
    candidate = Path(file_text).expanduser()
    if not candidate.is_absolute() and not candidate.exists() and (model_path.parent / candidate).exists():
        candidate = model_path.parent / candidate
    return candidate


def _relative_spec(spec: str | None, model_path: Path, out: Path) -> str | None:
    if spec is None:
        return None
    file = _spec_file(spec, model_path)
    if file is None:
        return spec
    name = _split(spec)[1]
    return _relative_to(file, out) + (f":{name}" if name else "")


def model_ref_for(user: UserModel, out: Path, *, build: str | None, eval: str | None,  # noqa: A002
                  inputs: str | None, model: torch.nn.Module | None = None,
                  weights: str | None = None, fidelity: Mapping[str, Any] | None = None) -> ModelRef:
    """The ModelRef for a plan written to `out`: the user's model file and the function specs they gave,
    files relative to `out`, plus digests of `model` (structure, FP32 weights) and of the user's files
    (`user.files`). `weights` is the weights digest when the caller already has it (one pass saved).

    A builder picked as MODEL.py:NAME is recorded as `build: NAME`; an hf: folder as `file: hf:FOLDER`; no
    `file` at all for functions with no model file (`tuner.tune()` in a notebook: `UserModel.no_file`).
    `fidelity` is a built-in metric's record (metric, output, data, tokenizer, batch_size; paths as given).
    """
    out, model_path = Path(out), Path(user.path)
    given = {"build": build, "eval": eval, "inputs": inputs}
    specs = {role: _relative_spec(spec, model_path, out) for role, spec in given.items()}
    if specs["build"] is None:
        name = getattr(user.build_fn, "__name__", DEFAULT_BUILD)
        specs["build"] = name if name != DEFAULT_BUILD and name.isidentifier() else None
    digests: dict[str, Any] = {}
    if model is not None:
        digests = {"structure": structure_digest(model), "weights": weights or weights_digest(model),
                   "source": source_digest(user.files or ((model_path,) if model_path.is_file() else ()))}
    record: dict[str, Any] = {k: v for k, v in (fidelity or {}).items() if v is not None}
    record.update({k: _relative_to(Path(record[k]), out) for k in ("data", "tokenizer") if k in record})
    file = None if user.no_file else ("hf:" if user.hf else "") + _relative_to(model_path, out)
    return ModelRef(file=file, build=specs["build"], eval=specs["eval"], inputs=specs["inputs"], **digests, **record)


def resolve_model_ref(ref: ModelRef, plan_dir: Path, *,
                      file: str | None = None) -> tuple[str, str | None, str | None, str | None]:
    """(model file, build, eval, inputs) with their files resolved relative to the plan's folder.

    `file` replaces the recorded model file (used as given): the recorded
    function specs still apply to it. Raises ConfigError naming every
    recorded file that is not there.
    """
    plan_dir = Path(plan_dir)
    problems: list[tuple[str, str]] = []

    def locate(role: str, text: str) -> str:
        folder = role == "model" and text.startswith("hf:")
        path = Path(text[3:] if folder else text).expanduser()
        path = Path(os.path.normpath(path if path.is_absolute() else plan_dir / path))
        if folder:
            if not path.is_dir():
                problems.append((role, f"model: the plan in {plan_dir} was made for the model folder {text}, which "
                                       f"is not there (looked for {path}); give the model"))
            return f"hf:{path}"
        if not path.is_file():
            what, hint = (("the model file", "give the model file") if role == "model" else
                          (f"the {role} function's file", f"give {role} as NAME or FILE.py:NAME"))
            problems.append((role, f"{role}: the plan in {plan_dir} was made for {text} ({what}), which is not "
                                   f"there (looked for {path}); {hint}"))
        return str(path)

    if file is None and ref.file is None:
        raise ConfigError(f"model: the plan in {plan_dir} was made by tuner.tune() in a notebook or a script, with "
                          "no model file to rebuild the model from; give one that defines build_model() and "
                          "evaluate(model): `model` MODEL.py", fields=("model",))
    if file is None:
        file = locate("model", str(ref.file))
    resolved: list[str | None] = []
    for role in FUNCTION_ROLES:
        spec = getattr(ref, role)
        file_text, name = _split(spec) if spec else ("", "")
        if not file_text:
            resolved.append(spec)
        else:
            resolved.append(locate(role, file_text) + (f":{name}" if name else ""))
    if problems:
        raise ConfigError([p for _, p in problems], fields=[f for f, _ in problems])
    return (file, *resolved)  # type: ignore[return-value]


def resolve_plan_path(text: str | None, plan_dir: Path) -> str | None:
    """A path a plan records (data file, tokenizer folder), relative to the plan's folder, as a usable path."""
    if text is None:
        return None
    path = Path(text).expanduser()
    return os.path.normpath(path if path.is_absolute() else Path(plan_dir) / path)

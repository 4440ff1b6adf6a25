"""Calibration batches: the inputs a built-in fidelity metric runs the model on, read one batch at a time.

Sources, each a `Calibration` whose `batches()` streams `ModelInputs` (one forward call each):

- `--data FILE.safetensors`: tensors named as the forward's keyword arguments (`input_ids`, `attention_mask`),
  or one tensor of any name for a model taking one positional argument; dim 0 is the sample, cut into batches
  of `batch_size` and read slice by slice (never the whole file);
- `--data FILE.pt`: a tensor or a dict of tensors (batched the same way), or a list of ready batches (each a
  tensor, tuple or dict, as `example_inputs()` returns);
- `--data FILE.jsonl`: one text per line (a JSON string, or an object with a "text" key), tokenized per batch
  by `--tokenizer DIR` (default: the hf: model's own folder) with padding and truncation to 128 tokens;
- the model file's `calibration_batches()` or an `example_inputs()` returning a list of batches.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tuner.core.errors import ConfigError
from tuner.core.fingerprint import sha256_file
from tuner.core.hf import offline_transformers
from tuner.core.inputs import ModelInputs

__all__ = ["Calibration", "data_file", "function_batches", "DATA_SUFFIXES", "MAX_TOKENS"]

DATA_SUFFIXES = (".safetensors", ".pt", ".pth", ".jsonl")
MAX_TOKENS = 128


@dataclass(frozen=True)
class Calibration:
    """Where the batches come from (`describe`), a digest of their source, and the batches themselves."""

    describe: str
    digest: str
    make: Callable[[], Iterator[ModelInputs]]

    def batches(self) -> Iterator[ModelInputs]:
        count = 0
        for batch in self.make():
            count += 1
            yield batch
        if count == 0:
            raise ConfigError(f"data: {self.describe} holds no batch", fields=("data",))

    def first(self) -> ModelInputs:
        return next(iter(self.batches()))


def function_batches(fn: Callable[[], Any], name: str, convert: Callable[[Any], ModelInputs]) -> Calibration:
    """Batches from the user's function (called once per pass); `convert` checks each batch's form."""
    def make() -> Iterator[ModelInputs]:
        for batch in fn():
            yield convert(batch)
    return Calibration(describe=f"{name}()", digest="", make=make)


def data_file(path_text: str, *, batch_size: int, tokenizer: str | None) -> Calibration:
    """The batches of a data file (see the module docstring); ConfigError (exit 2) when it cannot be used."""
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise ConfigError(f"data: file not found: {path_text}", fields=("data",))
    suffix = path.suffix.lower()
    if suffix not in DATA_SUFFIXES:
        raise ConfigError(f"data: {path_text} is not one of {', '.join(DATA_SUFFIXES)}", fields=("data",))
    digest = hashlib.sha256(f"{sha256_file(path)}:{batch_size}:{tokenizer}".encode()).hexdigest()
    if suffix == ".safetensors":
        make = _safetensors(path, batch_size)
    elif suffix == ".jsonl":
        make = _texts(path, batch_size, tokenizer)
    else:
        make = _torch_file(path, batch_size)
    return Calibration(describe=str(path_text), digest=digest, make=make)


def _slices(tensors: dict[str, Any], rows: int, batch_size: int) -> Iterator[ModelInputs]:
    for start in range(0, rows, batch_size):
        batch = {k: v[start:start + batch_size] for k, v in tensors.items()}
        yield ModelInputs.of(next(iter(batch.values())) if len(batch) == 1 else batch)


def _rows(path: Path, shapes: dict[str, list[int]]) -> int:
    sizes = {name: shape[0] if shape else 0 for name, shape in shapes.items()}
    if not sizes or len(set(sizes.values())) != 1 or 0 in sizes.values():
        raise ConfigError(f"data: the tensors of {path.name} must share their first (sample) dimension; found "
                          f"{sizes or 'none'}", fields=("data",))
    return next(iter(sizes.values()))


def _safetensors(path: Path, batch_size: int) -> Callable[[], Iterator[ModelInputs]]:
    from safetensors import safe_open

    def make() -> Iterator[ModelInputs]:
        with safe_open(str(path), framework="pt") as fh:
            keys = list(fh.keys())
            rows = _rows(path, {k: fh.get_slice(k).get_shape() for k in keys})
            for start in range(0, rows, batch_size):
                batch = {k: fh.get_slice(k)[start:start + batch_size] for k in keys}
                yield ModelInputs.of(batch[keys[0]] if len(keys) == 1 else batch)
    return make


def _torch_file(path: Path, batch_size: int) -> Callable[[], Iterator[ModelInputs]]:
    def make() -> Iterator[ModelInputs]:
        try:
            data = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:  # noqa: BLE001 - any unreadable file is bad input
            raise ConfigError(f"data: cannot read {path.name} as tensors: {type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''}", fields=("data",)) from None
        if isinstance(data, torch.Tensor):
            data = {"input": data}
        if isinstance(data, dict) and all(isinstance(v, torch.Tensor) for v in data.values()):
            rows = _rows(path, {k: list(v.shape) for k, v in data.items()})
            yield from _slices(data, rows, batch_size)
        elif isinstance(data, list):
            for batch in data:
                yield ModelInputs.of(batch)
        else:
            raise ConfigError(f"data: {path.name} holds {type(data).__name__}; expected a tensor, a dict of tensors "
                              "or a list of batches", fields=("data",))
    return make


def _text(line: str, path: Path, number: int) -> str:
    try:
        value = json.loads(line)
    except ValueError:
        raise ConfigError(f"data: {path.name}:{number} is not JSON (one JSON string or object per line)",
                          fields=("data",)) from None
    if isinstance(value, dict):
        value = value.get("text")
    if not isinstance(value, str):
        raise ConfigError(f"data: {path.name}:{number}: expected a string or an object with a \"text\" string",
                          fields=("data",))
    return value


def _texts(path: Path, batch_size: int, tokenizer: str | None) -> Callable[[], Iterator[ModelInputs]]:
    if tokenizer is None:
        raise ConfigError(f"tokenizer: {path.name} holds texts; give --tokenizer DIR (a folder with the tokenizer "
                          "files, such as the hf: model's)", fields=("tokenizer",))
    folder = Path(tokenizer).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"tokenizer: folder not found: {tokenizer}", fields=("tokenizer",))

    def make() -> Iterator[ModelInputs]:
        tok = offline_transformers().AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        texts: list[str] = []
        with open(path, encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if line.strip():
                    texts.append(_text(line, path, number))
                if len(texts) == batch_size:
                    yield ModelInputs.of(dict(tok(texts, padding=True, truncation=True, max_length=MAX_TOKENS,
                                                  return_tensors="pt")))
                    texts = []
        if texts:
            yield ModelInputs.of(dict(tok(texts, padding=True, truncation=True, max_length=MAX_TOKENS,
                                          return_tensors="pt")))
    return make

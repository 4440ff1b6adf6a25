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

A data file is checked whole when `data_file` is called, before a run claims its output folder or builds the
model: a file it cannot read, tensors whose shapes disagree, every bad `.jsonl` line, a tokenizer that does not
load. The tensors' names are checked against the model's forward (`Calibration.check_forward`) once the forward
is known. Each problem is a ConfigError (exit 2) naming the file and the fix, not a failure of the forward
reported as an error in the user's code long after.
"""
from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tuner.core.errors import ConfigError, exc_line
from tuner.core.fingerprint import sha256_file
from tuner.core.hf import offline_transformers
from tuner.core.inputs import ModelInputs

__all__ = ["Calibration", "data_file", "function_batches", "DATA_SUFFIXES", "MAX_TOKENS", "TOKEN_SHAPED"]

DATA_SUFFIXES = (".safetensors", ".pt", ".pth", ".jsonl")
MAX_TOKENS = 128
# One value per token, so one shape [samples, tokens] for all of them: a mask of another length than its ids is
# a file written from two tokenizer calls, which a model may broadcast without a word.
TOKEN_SHAPED = ("input_ids", "attention_mask", "token_type_ids", "position_ids")
TOKEN_IDS = ("input_ids", "decoder_input_ids")  # indices into the model's vocabulary (check_token_ids)
_SHOWN = 5  # bad .jsonl line numbers (and forward arguments) shown in one message


@dataclass(frozen=True)
class Calibration:
    """Where the batches come from (`describe`), a digest of their source, and the batches themselves.

    `names` are the keyword arguments the batches pass (a data file's tensor names); empty when they are
    positional or only known once the batches are made (the user's functions)."""

    describe: str
    digest: str
    make: Callable[[], Iterator[ModelInputs]]
    names: tuple[str, ...] = ()

    def batches(self) -> Iterator[ModelInputs]:
        count = 0
        for batch in self.make():
            count += 1
            yield batch
        if count == 0:
            raise ConfigError(f"data: {self.describe} holds no batch", fields=("data",))

    def first(self) -> ModelInputs:
        return next(iter(self.batches()))

    def check_forward(self, forward: Callable[..., Any], *, owner: str, strict: bool = False) -> None:
        """ConfigError (exit 2) when the batches pass a keyword `forward` does not take (`owner` names it).

        A forward with `**kwargs` takes any name, unless `strict`: a Hugging Face model's `**kwargs` are
        flags (output_attentions, ...), so a tensor named `foo` would be dropped without a word and the
        forward fail on what it then lacks ("specify exactly one of input_ids or inputs_embeds")."""
        unknown, taken = _not_taken(self.names, forward, strict=strict)
        if unknown:
            shown = ", ".join(taken[:_SHOWN]) + (", ..." if len(taken) > _SHOWN else "")
            raise ConfigError(f"data: {self.describe} holds {_plural(len(unknown), 'tensor')} "
                              f"{', '.join(unknown)}, which {owner} does not take (it takes {shown or 'none'}): "
                              "name each tensor after the forward's argument it is for", fields=("data",))


    def check_token_ids(self, vocab_size: int | None, *, first: str | None = None) -> None:
        """ConfigError (exit 2) naming the data and the fix when a batch's token ids are not integers or fall
        outside the model's vocabulary (`vocab_size`, its config's; None: not known), read once before anything
        is built: the forward would fail in the model's own code (an embedding's index error), far from the
        file at fault. `first`: the forward's first argument, which a batch of one tensor passes."""
        for batch in self.batches():
            named = dict(batch.kwargs)
            if first is not None and batch.args:
                named.setdefault(first, batch.args[0])
            for name in TOKEN_IDS:
                ids = named.get(name)
                if isinstance(ids, torch.Tensor):
                    self._check_ids(name, ids, vocab_size)

    def _check_ids(self, name: str, ids: torch.Tensor, vocab_size: int | None) -> None:
        if ids.is_floating_point() or ids.is_complex() or ids.dtype is torch.bool:
            raise ConfigError(f"data: {self.describe}: `{name}` holds {str(ids.dtype).replace('torch.', '')} values; "
                              f"token ids are integers: write it as torch.long ({name}.long())", fields=("data",))
        if vocab_size is None or ids.numel() == 0:
            return
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ConfigError(f"data: {self.describe}: `{name}` holds token id {bad}, outside the model's vocabulary "
                              f"(0 to {vocab_size - 1}, vocab_size in its config.json): tokenize the data with "
                              "the model's own tokenizer", fields=("data",))


def _not_taken(names: Sequence[str], forward: Callable[..., Any], *, strict: bool) -> tuple[list[str], list[str]]:
    """(the `names` `forward` does not take by keyword, the names it does take)."""
    try:
        params = list(inspect.signature(forward).parameters.values())
    except (TypeError, ValueError):  # no signature to read (a builtin): the call itself will tell
        return [], []
    taken = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"]
    if any(p.kind is p.VAR_KEYWORD for p in params) and (not strict or not taken):
        return [], taken
    return [n for n in names if n not in taken], taken


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def function_batches(fn: Callable[[], Any], name: str, convert: Callable[[Any], ModelInputs]) -> Calibration:
    """Batches from the user's function (called once per pass); `convert` checks each batch's form."""
    def make() -> Iterator[ModelInputs]:
        for batch in fn():
            yield convert(batch)
    return Calibration(describe=f"{name}()", digest="", make=make)


def data_file(path_text: str, *, batch_size: int, tokenizer: str | None) -> Calibration:
    """The batches of a data file (see the module docstring), the file checked whole first; ConfigError (exit 2)
    naming the file and the fix when it cannot be used."""
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise ConfigError(f"data: file not found: {path_text}", fields=("data",))
    suffix = path.suffix.lower()
    if suffix not in DATA_SUFFIXES:
        raise ConfigError(f"data: {path_text} is not one of {', '.join(DATA_SUFFIXES)}", fields=("data",))
    digest = hashlib.sha256(f"{sha256_file(path)}:{batch_size}:{tokenizer}".encode()).hexdigest()
    names: tuple[str, ...] = ()
    if suffix == ".safetensors":
        make, names = _safetensors(path, batch_size)
    elif suffix == ".jsonl":
        make = _texts(path, batch_size, tokenizer)
    else:
        make, names = _torch_file(path, batch_size)
    return Calibration(describe=str(path_text), digest=digest, make=make, names=names)


def _slices(tensors: dict[str, Any], rows: int, batch_size: int) -> Iterator[ModelInputs]:
    for start in range(0, rows, batch_size):
        batch = {k: v[start:start + batch_size] for k, v in tensors.items()}
        yield ModelInputs.of(next(iter(batch.values())) if len(batch) == 1 else batch)


def _shapes_text(shapes: Mapping[str, Sequence[int]]) -> str:
    return ", ".join(f"{name} {list(shape)}" for name, shape in shapes.items()) or "no tensor"


def _rows(path: Path, shapes: Mapping[str, Sequence[int]], where: str = "") -> int:
    """The samples the tensors hold (their shared first dimension); ConfigError when their shapes disagree."""
    sizes = {name: shape[0] if shape else 0 for name, shape in shapes.items()}
    if not sizes or len(set(sizes.values())) != 1 or 0 in sizes.values():
        raise ConfigError(f"data: the tensors of {path.name}{where} must share their first (sample) dimension, "
                          f"at least 1; found {_shapes_text(shapes)}: write every tensor with one row per sample",
                          fields=("data",))
    tokens = {name: shape for name, shape in shapes.items() if name in TOKEN_SHAPED}
    if len({tuple(shape) for shape in tokens.values()}) > 1:
        raise ConfigError(f"data: the token tensors of {path.name}{where} disagree in shape ({_shapes_text(tokens)}): "
                          f"{', '.join(tokens)} must share one shape [samples, tokens]; write them from one "
                          "tokenizer call (padding=True)", fields=("data",))
    return next(iter(sizes.values()))


def _unreadable(path: Path, kind: str, exc: BaseException, fix: str) -> ConfigError:
    return ConfigError(f"data: cannot read {path.name} as {kind} ({exc_line(exc, 120)}): {fix}", fields=("data",))


def _safetensors(path: Path, batch_size: int) -> tuple[Callable[[], Iterator[ModelInputs]], tuple[str, ...]]:
    from safetensors import safe_open

    try:  # the header alone: names and shapes, no tensor read
        with safe_open(str(path), framework="pt") as fh:
            shapes = {k: fh.get_slice(k).get_shape() for k in fh.keys()}
    except Exception as exc:  # noqa: BLE001 - any unreadable file is bad input (SafetensorError, OSError)
        raise _unreadable(path, "safetensors", exc, "the file is damaged or not a .safetensors file; write it again "
                          "with safetensors.torch.save_file({name: tensor, ...}, path)") from None
    rows = _rows(path, shapes)
    keys = list(shapes)

    def make() -> Iterator[ModelInputs]:
        with safe_open(str(path), framework="pt") as fh:
            for start in range(0, rows, batch_size):
                batch = {k: fh.get_slice(k)[start:start + batch_size] for k in keys}
                yield ModelInputs.of(batch[keys[0]] if len(keys) == 1 else batch)
    return make, tuple(keys) if len(keys) > 1 else ()


def _load_torch(path: Path) -> Any:
    try:
        data = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is bad input
        raise _unreadable(path, "tensors", exc, "write it with torch.save(tensor or {name: tensor, ...}, path) "
                          "(or use .safetensors)") from None
    return {"input": data} if isinstance(data, torch.Tensor) else data


def _batch_names(path: Path, data: Any) -> tuple[str, ...]:
    """The keyword names of a .pt file's tensors (a dict, or a list of ready batches), its shapes checked."""
    if isinstance(data, dict) and data and all(isinstance(v, torch.Tensor) for v in data.values()):
        _rows(path, {k: list(v.shape) for k, v in data.items()})
        return tuple(data) if len(data) > 1 else ()
    if not isinstance(data, list):
        raise ConfigError(f"data: {path.name} holds {type(data).__name__}; expected a tensor, a dict of tensors "
                          "or a list of batches", fields=("data",))
    names: dict[str, None] = {}
    for i, batch in enumerate(data):
        if isinstance(batch, dict):
            tensors = {k: list(v.shape) for k, v in batch.items() if isinstance(v, torch.Tensor)}
            _rows(path, tensors, f" (batch {i})")
            names.update(dict.fromkeys(batch))
    return tuple(names)


def _torch_file(path: Path, batch_size: int) -> tuple[Callable[[], Iterator[ModelInputs]], tuple[str, ...]]:
    names = _batch_names(path, _load_torch(path))

    def make() -> Iterator[ModelInputs]:
        data = _load_torch(path)
        if isinstance(data, dict):
            yield from _slices(data, _rows(path, {k: list(v.shape) for k, v in data.items()}), batch_size)
        else:
            for batch in data:
                yield ModelInputs.of(batch)
    return make, names


def _text(line: str) -> str | None:
    """The text of one .jsonl line; None when the line is not one (not JSON, or no "text" string)."""
    try:
        value = json.loads(line)
    except ValueError:
        return None
    if isinstance(value, dict):
        value = value.get("text")
    return value if isinstance(value, str) else None


def _check_lines(path: Path) -> None:
    """ConfigError counting every line of a .jsonl file that is not a text (with the first few line numbers)."""
    bad: list[int] = []
    count = 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, 1):
            if line.strip():
                count += 1
                if _text(line) is None:
                    bad.append(number)
    if bad:
        shown = ", ".join(map(str, bad[:_SHOWN])) + (", ..." if len(bad) > _SHOWN else "")
        verb, noun = ("is", "line") if len(bad) == 1 else ("are", "lines")
        raise ConfigError(f"data: {path.name}: {_plural(len(bad), 'line')} of {count} {verb} not a text ({noun} "
                          f"{shown}): write one JSON string or "
                          "object with a \"text\" string per line", fields=("data",))
    if count == 0:
        raise ConfigError(f"data: {path.name} holds no text: write one JSON string or object with a \"text\" "
                          "string per line", fields=("data",))


def _tokenizer(folder: Path) -> Any:
    try:
        return offline_transformers().AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - a folder without a usable tokenizer is bad input
        raise ConfigError(f"tokenizer: cannot load a tokenizer from {folder} ({exc_line(exc, 120)}): give "
                          "--tokenizer DIR, a folder holding the model's tokenizer files (tokenizer.json, "
                          "tokenizer_config.json)", fields=("tokenizer",)) from None


def _texts(path: Path, batch_size: int, tokenizer: str | None) -> Callable[[], Iterator[ModelInputs]]:
    if tokenizer is None:
        raise ConfigError(f"tokenizer: {path.name} holds texts; give --tokenizer DIR (a folder with the tokenizer "
                          "files, such as the hf: model's)", fields=("tokenizer",))
    folder = Path(tokenizer).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"tokenizer: folder not found: {tokenizer}", fields=("tokenizer",))
    _check_lines(path)
    tok = _tokenizer(folder)

    def encode(texts: list[str]) -> ModelInputs:
        return ModelInputs.of(dict(tok(texts, padding=True, truncation=True, max_length=MAX_TOKENS,
                                       return_tensors="pt")))

    def make() -> Iterator[ModelInputs]:
        texts: list[str] = []
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                text = _text(line) if line.strip() else None
                if text is not None:
                    texts.append(text)
                if len(texts) == batch_size:
                    yield encode(texts)
                    texts = []
        if texts:
            yield encode(texts)
    return make

"""The FP32 reference of a built-in fidelity metric, computed once and kept on disk, and the metric's evaluate.

`FidelityEvaluate` is an ordinary `evaluate(model) -> float` built by mpt: the search, its noise rules
and `mpt check` treat it like the user's own. On its first call it builds the FP32 model once more
(`build`), runs it on every calibration batch and writes what the metric needs of each batch's output
(`tuner.measure.fidelity.reference_of`) to `fidelity-reference.safetensors` in `--out`, streamed: one
batch's output in memory at a time (each tensor is appended to a part file, and the safetensors header,
which needs every shape, is written in front once all are known). A later run in the same folder with the
same metric, output and data (`--resume`) reads it instead. Every evaluation then streams the batches
again and compares each with its reference tensor, read alone.
"""
from __future__ import annotations

import os
import shutil
import struct
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from tuner.core.calibration import Calibration
from tuner.core.fingerprint import sha256_file
from tuner.core.inputs import ModelInputs
from tuner.core.loader import call_forward
from tuner.core.output_files import REFERENCE_NAME
from tuner.core.safetensors_write import FORMAT_DTYPES, encode_header
from tuner.measure.fidelity import Metric, MetricSum, reference_of, select_output
from tuner.workspace.manifest import Manifest

__all__ = ["FidelityEvaluate", "write_streamed", "read_key"]


def write_streamed(path: Path, tensors: Iterator[tuple[str, torch.Tensor]], metadata: dict[str, str]) -> None:
    """A safetensors file from tensors made one at a time (only one held at once), written atomically."""
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    fd, part = tempfile.mkstemp(prefix=".reference-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            for name, tensor in tensors:
                data = tensor.detach().contiguous().cpu().numpy().tobytes()
                header[name] = {"dtype": FORMAT_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                                "data_offsets": [offset, offset + len(data)]}
                fh.write(data)
                offset += len(data)
        head = encode_header(header)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as out, open(part, "rb") as src:
            out.write(struct.pack("<Q", len(head)) + head)
            shutil.copyfileobj(src, out, 1 << 20)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    finally:
        os.unlink(part)


def read_key(path: Path) -> str | None:
    """The `key` metadata of a reference file (None when it is not one)."""
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as fh:
            return (fh.metadata() or {}).get("key")
    except Exception:  # noqa: BLE001 - unreadable or half-written: computed again
        return None


def _mask(batch: ModelInputs) -> torch.Tensor | None:
    mask = dict(batch.kwargs).get("attention_mask")
    return mask if isinstance(mask, torch.Tensor) else None


class FidelityEvaluate:
    """`evaluate(model)` for a built-in metric: the metric of `model`'s outputs against the FP32 reference.

    `folder` is where the reference file lives (`--out`); None keeps it in a temporary folder for this
    process (`mpt check`, `tuner.tune` without an output folder).
    """

    mpt_builtin = True  # tuner.core.loader: mpt's own evaluate (its errors are not the user's code)
    __name__ = "evaluate"

    def __init__(self, metric: Metric, data: Calibration, build: Callable[[], torch.nn.Module], *,
                 output: str | None, device: str, folder: Path | None) -> None:
        self.metric, self.data, self.build, self.output, self.device = metric, data, build, output, device
        self._temp: tempfile.TemporaryDirectory[str] | None = None
        self.folder = folder
        self.key = f"{metric.value}|{output or ''}|{data.digest or data.describe}"

    def describe(self) -> str:
        return f"{self.metric.value} of {self.output or 'the output'} against FP32 on {self.data.describe}"

    def _path(self) -> Path:
        if self.folder is None:
            self._temp = self._temp or tempfile.TemporaryDirectory(prefix="mpt-reference-")
            return Path(self._temp.name) / REFERENCE_NAME
        return self.folder / REFERENCE_NAME

    def _forward(self, model: torch.nn.Module, batch: ModelInputs) -> torch.Tensor:
        with torch.no_grad():
            out = call_forward(model, batch.to(self.device), what="forward on a calibration batch")
        return select_output(out, self.output)

    def _reference(self) -> Path:
        path = self._path()
        if path.is_file() and read_key(path) == self.key:
            return path
        manifest = Manifest(path.parent) if self.folder is not None else None
        if manifest is not None:
            manifest.check_ours([REFERENCE_NAME])  # a file mpt did not write is never replaced
            manifest.writing(REFERENCE_NAME)

        def tensors() -> Iterator[tuple[str, torch.Tensor]]:
            model = self.build().to(self.device).eval()  # the FP32 model, built once more, dropped when written
            for i, batch in enumerate(self.data.batches()):
                yield f"batch.{i}", reference_of(self.metric, self._forward(model, batch), _mask(batch)).cpu()

        write_streamed(path, tensors(), {"key": self.key})
        if manifest is not None:
            manifest.wrote({REFERENCE_NAME: sha256_file(path)})
        return path

    def __call__(self, model: torch.nn.Module) -> float:
        from safetensors import safe_open

        path = self._reference()
        total = MetricSum(self.metric)
        with safe_open(str(path), framework="pt") as fh:
            count = len([k for k in fh.keys() if k.startswith("batch.")])
            for i, batch in enumerate(self.data.batches()):
                if i >= count:
                    break
                total.add(self._forward(model, batch), _mask(batch), fh.get_tensor(f"batch.{i}"))
        return total.value()

"""The FP32 reference of a built-in fidelity metric, computed once, and the metric's evaluate.

`FidelityEvaluate` is an ordinary `evaluate(model) -> float` built by mpt: the search, its noise rules
and `mpt check` treat it like the user's own. The first time it is called it computes what the metric needs
of the FP32 model's output on each calibration batch (`tuner.measure.fidelity.reference_of`): from the model
it was handed when that is the FP32 model as built (the search's baseline evaluation: no plan attached, every
floating tensor FP32), else from a model it builds once more (`build`).

Where the reference is kept is sized against what an evaluation costs (issue 33): on the model's device, as
long as it takes at most `MEMORY_SHARE` of that device's free memory, so no trial reads a file and no byte of
it crosses to the host; past that budget it is written to `fidelity-reference.safetensors` in `--out`,
streamed (one batch's output in memory at a time; the safetensors header, which needs every shape, is written
in front once all are known), and every evaluation reads each batch's tensor alone. A later run in the same
folder with the same metric, output and data (`--resume`) reads a written file instead of computing it; a
reference kept in memory costs a resumed run one more FP32 pass.
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
from tuner.core.inputs import ModelInputs, detached_copy, same_inputs
from tuner.core.loader import call_forward
from tuner.core.output_files import REFERENCE_NAME
from tuner.core.safetensors_write import FORMAT_DTYPES, encode_header
from tuner.engine.attach import attached
from tuner.engine.function_mode import LOWER_DTYPES
from tuner.measure.fidelity import Metric, MetricSum, reference_of, select_output
from tuner.measure.output_meaning import Frame, frame_of
from tuner.workspace.manifest import Manifest

__all__ = ["FidelityEvaluate", "first_output_of", "write_streamed", "read_key"]


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


MEMORY_SHARE = 0.25  # of the device's free memory the reference may take before it is streamed to a file


def memory_budget(device: str | torch.device) -> int:
    """Bytes of reference the device may hold: `MEMORY_SHARE` of its free memory (a CUDA device's as torch's
    allocator sees it, the host's available memory for the CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
    else:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):  # no sysconf: a modest fixed budget
            free = 1 << 30
    return int(free * MEMORY_SHARE)


def as_built_fp32(model: torch.nn.Module) -> bool:
    """`model` is the FP32 model with no plan attached (float64, complex or integer tensors of its own allowed):
    what `ModelKeeper` lends for the baseline evaluation, whose outputs are the reference (the keeper has checked
    that every build gives the same weights)."""
    tensors = (*model.parameters(), *model.buffers())  # a trial's model holds the weights its checkpoint stores lowered
    return attached(model) is None and not any(t.dtype in LOWER_DTYPES for t in tensors)


class FidelityEvaluate:
    """`evaluate(model)` for a built-in metric: the metric of `model`'s outputs against the FP32 reference.

    `folder` is where the reference file lives when it is written (`--out`); None keeps it in a temporary
    folder for this process (`mpt check`, `tuner.tune` without an output folder).
    """

    mpt_builtin = True  # tuner.core.loader: mpt's own evaluate (its errors are not the user's code)
    __name__ = "evaluate"

    def __init__(self, metric: Metric, data: Calibration, build: Callable[[], torch.nn.Module], *,
                 output: str | None, device: str, folder: Path | None) -> None:
        self.metric, self.data, self.build, self.output, self.device = metric, data, build, output, device
        self._temp: tempfile.TemporaryDirectory[str] | None = None
        self.folder = folder
        self.key = f"{metric.value}|{output or ''}|{data.digest or data.describe}"
        self.held: list[torch.Tensor] | None = None  # the reference, batch by batch, on the device
        self.builds = 0  # FP32 models built for the reference (0 when the baseline's model gave it)
        self.metric_step: float | None = None  # the least change of a discrete metric, once it has run
        # the FP32 model's whole output on the first batch, kept from the baseline's reference pass until the
        # search takes it (`first_output`): its candidates' FP32 forward on those same inputs, not run again
        self._first: tuple[ModelInputs, Any] | None = None
        self.keep_first = False  # whether to keep it: a tune asks (`first_output_of`), `mpt check` does not

    def describe(self) -> str:
        return f"{self.metric.value} of {self.output or 'the output'} against FP32 on {self.data.describe}"

    def _path(self) -> Path:
        if self.folder is None:
            self._temp = self._temp or tempfile.TemporaryDirectory(prefix="mpt-reference-")
            return Path(self._temp.name) / REFERENCE_NAME
        return self.folder / REFERENCE_NAME

    def _forward(self, model: torch.nn.Module, batch: ModelInputs,
                 keep: bool = False) -> tuple[torch.Tensor, Frame]:
        """The compared output of `model` on `batch`, and what its positions mean (`frame_of`). `keep`: the
        whole output is also kept for `first_output` (a copy no later forward can rewrite)."""
        batch = batch.to(self.device)
        with torch.no_grad():
            out = call_forward(model, batch, what="forward on a calibration batch")
        if keep:
            self._first = (batch, detached_copy(out))
        y = select_output(out, self.output)
        return y, frame_of(y, batch, model, output=self.output, loss=self.metric.scores_tokens)

    def _score(self, total: MetricSum, model: torch.nn.Module, batch: ModelInputs, reference: torch.Tensor) -> None:
        total.add(*self._forward(model, batch), reference)

    def _compute(self, model: torch.nn.Module | None, total: MetricSum) -> None:
        """The reference, from `model` (the FP32 model as built) or a model built for it, each batch also
        scored into `total` (the FP32 model against itself: the baseline's value); kept on the device while it
        fits `memory_budget`, else streamed to the file (`_write`)."""
        own = model is not None
        if model is None:
            model = self.build().to(self.device).eval()  # the FP32 model, built once more, dropped when done
            self.builds += 1
        kept: list[torch.Tensor] = []
        budget, size = memory_budget(self.device), 0

        for batch in self.data.batches():
            y, frame = self._forward(model, batch, keep=own and self.keep_first and not kept)
            ref = reference_of(self.metric, y, frame)
            total.add(y, frame, ref)
            del y
            size += ref.numel() * ref.element_size()
            kept.append(ref)
            if size > budget:
                break
        else:
            self.held = kept
            return
        self._write(model, kept, total)

    def _write(self, model: torch.nn.Module, kept: list[torch.Tensor], total: MetricSum) -> None:
        """The reference past the memory budget: the batches computed so far, then the rest, into the file."""
        path = self._path()
        manifest = Manifest(path.parent) if self.folder is not None else None
        if manifest is not None:
            manifest.check_ours([REFERENCE_NAME])  # a file mpt did not write is never replaced
            manifest.writing(REFERENCE_NAME)

        def tensors() -> Iterator[tuple[str, torch.Tensor]]:
            done = len(kept)
            for i in range(done):
                yield f"batch.{i}", kept[i].cpu()
                kept[i] = torch.empty(0)  # written: its memory goes
            for i, batch in enumerate(self.data.batches()):
                if i < done:
                    continue
                y, frame = self._forward(model, batch)
                ref = reference_of(self.metric, y, frame)
                total.add(y, frame, ref)
                yield f"batch.{i}", ref.cpu()

        write_streamed(path, tensors(), {"key": self.key})
        if manifest is not None:
            manifest.wrote({REFERENCE_NAME: sha256_file(path)})

    def __call__(self, model: torch.nn.Module) -> float:
        if self.held is not None:
            return self._from_held(model)
        path = self._path()
        if path.is_file() and read_key(path) == self.key:
            return self._from_file(path, model)
        own = as_built_fp32(model)
        total = MetricSum(self.metric)
        self._compute(model if own else None, total)
        if own:  # scored while the reference was taken from it
            return self._value(total)
        return self._from_held(model) if self.held is not None else self._from_file(path, model)

    def first_output(self, inputs: ModelInputs) -> Any | None:
        """The FP32 model's output on `inputs` when they are the first calibration batch and the baseline's
        reference pass ran the model as built on it (what `call_forward` under no_grad gave there: the search's
        FP32 reference forward on its example inputs, which are that batch, would give the same); None
        otherwise. Given once: the caller keeps it, and the memory is not held twice."""
        found, self._first = self._first, None
        if found is None or not same_inputs(found[0], inputs):
            return None
        return found[1]

    def _value(self, total: MetricSum) -> float:
        self.metric_step = total.step()
        return total.value()

    def _from_held(self, model: torch.nn.Module) -> float:
        """The metric of `model` against the reference kept on the device."""
        total = MetricSum(self.metric)
        for batch, reference in zip(self.data.batches(), self.held or (), strict=False):
            self._score(total, model, batch, reference)
        return self._value(total)

    def _from_file(self, path: Path, model: torch.nn.Module) -> float:
        """The metric of `model` against the reference file, each batch's tensor read alone."""
        from safetensors import safe_open

        total = MetricSum(self.metric)
        with safe_open(str(path), framework="pt") as fh:
            count = len([k for k in fh.keys() if k.startswith("batch.")])
            for i, batch in enumerate(self.data.batches()):
                if i >= count:
                    break
                self._score(total, model, batch, fh.get_tensor(f"batch.{i}"))
        return self._value(total)


def first_output_of(evaluate: Any) -> Callable[[ModelInputs], Any] | None:
    """`evaluate.first_output` when `evaluate` is a built-in metric's (which then keeps the FP32 output of its
    first batch from the baseline's reference pass for it), else None: a tune's FP32 reference forward on its
    example inputs, where that batch is them, costs nothing then."""
    if not isinstance(evaluate, FidelityEvaluate):
        return None
    evaluate.keep_first = True
    return evaluate.first_output


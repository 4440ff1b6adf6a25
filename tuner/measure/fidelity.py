"""Built-in fidelity metrics: how close a trial's outputs stay to the FP32 model's on calibration batches.

Most users of a precision tuner have no labelled eval set: what they want is "stay this close to FP32".
A `Metric` compares one output tensor (picked by `select_output`) batch by batch against the FP32
reference and accumulates a single number, so the batches stream and memory stays one batch's worth:

    agreement  share of positions whose top-1 class is the FP32 model's (higher is better, FP32: 1)
    cosine     mean cosine similarity of the output vectors (higher is better, FP32: 1)
    kl         mean KL(FP32 || trial) of the softmax over the classes, in nats (lower is better, FP32: 0)
    rel-error  relative L2 error ||y - y_ref|| / ||y_ref|| over all positions (lower is better, FP32: 0)
    loss       the language model's own mean next-token NLL on the data, in nats (lower is better)
    perplexity exp(loss) (lower is better)

A "position" is what `tuner.measure.output_meaning.Frame` says: a sample of [batch, classes], a token of
[batch, tokens, ...] or of a discriminator's [batch, tokens] (one binary score: its sign is the answer), a pixel
of [batch, classes, h, w]; padded tokens (mask 0) are left out.
"""
from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tuner.core.errors import ConfigError
from tuner.measure.output_meaning import IGNORE, Frame, Layout

__all__ = ["Metric", "select_output", "reference_of", "MetricSum", "DEFAULT_OUTPUTS", "Frame", "Layout"]

# Tried in order when no output is named: a head's logits, a sentence encoder's embedding, an encoder's states.
DEFAULT_OUTPUTS = ("logits", "sentence_embedding", "last_hidden_state")


class Metric(str, enum.Enum):
    """A built-in fidelity metric; its direction and default tolerance (absolute where the FP32 value is exact:
    the metrics against FP32; relative for the loss metrics, whose FP32 value is the model's own)."""

    AGREEMENT = "agreement"
    COSINE = "cosine"
    KL = "kl"
    REL_ERROR = "rel-error"
    LOSS = "loss"
    PERPLEXITY = "perplexity"

    @property
    def lower_is_better(self) -> bool:
        return self in (Metric.KL, Metric.REL_ERROR, Metric.LOSS, Metric.PERPLEXITY)

    @property
    def scores_tokens(self) -> bool:
        """The metric scores the data's next tokens with the model's logits (no FP32 outputs compared)."""
        return self in (Metric.LOSS, Metric.PERPLEXITY)

    @property
    def absolute(self) -> bool:
        return not self.scores_tokens

    @property
    def default_tolerance(self) -> float:
        return _DEFAULT_TOLERANCE[self]


_DEFAULT_TOLERANCE = {Metric.AGREEMENT: 0.01, Metric.COSINE: 0.001, Metric.KL: 0.01, Metric.REL_ERROR: 0.02,
                      Metric.LOSS: 0.01, Metric.PERPLEXITY: 0.01}


def _step(value: Any, key: str) -> Any:
    if isinstance(value, Mapping):
        return value[key] if key in value else None
    if isinstance(value, (tuple, list)) and key.isdigit():
        index = int(key)
        return value[index] if index < len(value) else None
    return getattr(value, key, None) if not key.startswith("_") else None


def _keys(value: Any) -> list[str]:
    if isinstance(value, Mapping):
        return [str(k) for k, v in value.items() if isinstance(v, Tensor)]
    if isinstance(value, (tuple, list)):
        return [str(i) for i, v in enumerate(value) if isinstance(v, Tensor)]
    return []


def select_output(output: Any, path: str | None) -> Tensor:
    """The tensor the metric compares: `path` (`logits`, `last_hidden_state`, a dotted path such as
    `hidden_states.2`), or by default the whole output when it is a tensor, else the first of
    DEFAULT_OUTPUTS present, else its first tensor. ConfigError naming the path when it leads nowhere."""
    if path is None:
        if isinstance(output, Tensor):
            return output
        for key in DEFAULT_OUTPUTS:
            found = _step(output, key)
            if isinstance(found, Tensor):
                return found
        keys = _keys(output)
        if keys:
            return select_output(output, keys[0])
        raise ConfigError(f"output: the model returned {type(output).__name__} with no tensor to compare; "
                          "name one with --output", fields=("output",))
    value = output
    for key in path.split("."):
        value = _step(value, key)
        if value is None:
            break
    if not isinstance(value, Tensor):
        found = ", ".join(_keys(output)) or type(output).__name__
        raise ConfigError(f"output: {path!r} is not a tensor in the model's output (it has: {found})",
                          fields=("output",))
    return value


def _positions(y: Tensor, frame: Frame) -> Tensor:
    """`y` as rows [N, scores], one per position of `frame`'s layout (a token score is a row of one); masked
    positions dropped."""
    y = y.float()
    if frame.layout is Layout.PIXELS:
        y = y.movedim(1, -1)
    elif frame.layout is Layout.TOKEN_SCORES:
        y = y.unsqueeze(-1)
    elif y.dim() == 1:
        y = y.unsqueeze(0)
    lead, mask = y.shape[:-1], frame.mask
    flat = y.reshape(-1, y.shape[-1])
    if frame.layout is not Layout.PIXELS and mask is not None and len(lead) >= 2 \
            and tuple(mask.shape) == tuple(lead[:2]):
        keep = mask.reshape(mask.shape[0], mask.shape[1], *([1] * (len(lead) - 2))).expand(lead).reshape(-1) != 0
        flat = flat[keep.to(flat.device)]
    return flat


def _classes(rows: Tensor) -> Tensor:
    """Rows of class scores: a single score is a binary logit, the classes (x, 0) (softmax: sigmoid(x))."""
    return torch.cat([rows, torch.zeros_like(rows)], dim=-1) if rows.shape[-1] == 1 else rows


def reference_of(metric: Metric, y: Tensor, frame: Frame) -> Tensor:
    """What the reference store keeps of the FP32 output for `metric`: the top-1 index per position for
    agreement (small), the log-probabilities for kl, the target token per logits position for the loss metrics
    (the output is not needed), the float output rows otherwise."""
    if metric.scores_tokens:
        assert frame.targets is not None, "the loss metrics' frame holds the targets"
        return frame.targets.reshape(-1)
    if metric is Metric.AGREEMENT:
        if y.dim() < 2:
            raise ConfigError("metric: agreement compares the top-1 class, and needs an output with a class "
                              f"dimension (found shape {list(y.shape)}); use cosine or rel-error", fields=("metric",))
        return _classes(_positions(y, frame)).argmax(dim=-1)
    rows = _positions(y, frame)
    if metric is Metric.COSINE and rows.shape[-1] == 1:
        raise ConfigError(f"metric: cosine compares vectors, and this output (shape {list(y.shape)}, "
                          f"{frame.layout.value}) holds one number per position, whose cosine is only its sign: use "
                          "agreement, kl or rel-error", fields=("metric",))
    return torch.log_softmax(_classes(rows), dim=-1) if metric is Metric.KL else rows


_COSINE_EPS = 1e-8  # torch.nn.functional.cosine_similarity's: a zero row against another scores 0, not NaN
# float64 elements per step of the metrics taken in float64 (32 MiB): an LM's logits over a large vocabulary are
# compared a slice of rows at a time, not as float64 copies of the whole batch (2-3 times its float32 size)
_CHUNK = 1 << 22


def _summed(per_row: Callable[..., Tensor], *tensors: Tensor) -> float:
    """The sum of `per_row` over all rows of `tensors` (same row count), taken a `_CHUNK` of elements at a time."""
    step = max(1, _CHUNK // max(1, tensors[0][0].numel())) if tensors[0].shape[0] else 1
    total = 0.0
    for start in range(0, tensors[0].shape[0], step):
        total += float(per_row(*(t[start:start + step] for t in tensors)).sum())
    return total


def _cosine(rows: Tensor, reference: Tensor) -> Tensor:
    """The cosine of each row with its reference row, in float64; exactly 1 where the two rows are equal.

    An output against itself (the FP32 baseline) must score the metric's ideal value on every CPU, but a row's
    dot product and norms round apart in float32: `cosine_similarity(y, y)` is 0.99999999 for many rows, which
    ones depending on the CPU's kernels (issue 47). So an equal row (a zero one included) is 1 by definition,
    and the others are taken in float64, where a trial's small differences stay visible to 1e-15."""
    a, b = rows.double(), reference.double()
    cos = (a * b).sum(dim=-1) / ((a * a).sum(dim=-1) * (b * b).sum(dim=-1)).clamp(min=_COSINE_EPS ** 2).sqrt()
    return torch.where((rows == reference).all(dim=-1), torch.ones_like(cos), cos.clamp(-1.0, 1.0))


def _kl(logp: Tensor, reference: Tensor) -> Tensor:
    """KL(FP32 || trial) per row from float32 log-probabilities (both as reference_of takes them, so an output
    against itself gives the reference's own bits: 0), their difference and its weighting in float64. KL >= 0;
    float rounding of two nearly equal distributions gives -1e-8 at a position, which printed as a negative KL
    reads as a bug: such a position counts as 0 (it is 0 to that precision)."""
    ref = reference.double()
    return (ref.exp() * (ref - logp.double())).sum(dim=-1).clamp(min=0)


@dataclass
class MetricSum:
    """The running sums of one metric over batches; `value()` is the metric over all of them."""

    metric: Metric
    total: float = 0.0
    count: float = 0.0

    def add(self, y: Tensor, frame: Frame, reference: Tensor) -> None:
        """Add one batch: `y` the trial's output, `reference` what `reference_of` kept of the FP32 one."""
        if self.metric.scores_tokens:
            self._add_nll(y.detach(), reference)
            return
        rows = _positions(y.detach(), frame)
        if rows.shape[0] != reference.shape[0]:
            raise ConfigError(f"output: the compared output has {rows.shape[0]} positions in this batch, the FP32 "
                              f"reference {reference.shape[0]}: the model's output shape changed", fields=("output",))
        reference = reference.to(rows.device)
        if self.metric is Metric.AGREEMENT:
            self.total += float((_classes(rows).argmax(dim=-1) == reference).sum())
            self.count += rows.shape[0]
        elif self.metric is Metric.COSINE:
            self.total += _summed(_cosine, rows, reference)
            self.count += rows.shape[0]
        elif self.metric is Metric.KL:
            self.total += _summed(_kl, torch.log_softmax(_classes(rows), dim=-1), reference)
            self.count += rows.shape[0]
        else:
            self.total += float((rows - reference).double().pow(2).sum())
            self.count += float(reference.double().pow(2).sum())

    def _add_nll(self, logits: Tensor, targets: Tensor) -> None:
        """The summed next-token NLL of the scored positions (targets not IGNORE), in float32 or wider."""
        rows = logits.reshape(-1, logits.shape[-1])
        targets = targets.to(rows.device)
        if rows.shape[0] != targets.shape[0]:
            raise ConfigError(f"output: the logits have {rows.shape[0]} positions in this batch, the token targets "
                              f"{targets.shape[0]}: the model's output shape changed", fields=("output",))
        nll = torch.nn.functional.cross_entropy(rows.float(), targets, ignore_index=IGNORE, reduction="sum")
        self.total += float(nll.double())
        self.count += float((targets != IGNORE).sum())

    def value(self) -> float:
        if self.count == 0:
            return math.nan
        if self.metric is Metric.REL_ERROR:
            return math.sqrt(self.total / self.count)
        if self.metric is Metric.PERPLEXITY:
            return math.exp(self.total / self.count)
        return self.total / self.count

    def step(self) -> float | None:
        """The least change of `value()` between two evaluations on the same data: one position's answer
        (1 / positions) for agreement, which counts answers; None for a continuous metric."""
        return 1.0 / self.count if self.metric is Metric.AGREEMENT and self.count > 0 else None

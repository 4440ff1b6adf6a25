"""What the compared output's positions mean on one batch: where its classes lie, which positions are padding,
and (for `loss` and `perplexity`) which token each position predicts.

A built-in metric compares positions: a sample of a classifier's `[batch, classes]`, a token of an LM's
`[batch, tokens, vocab]`, a pixel of a segmentation map's `[batch, classes, h, w]`, a token of a discriminator's
`[batch, tokens]` (one binary score per token: `ElectraForPreTraining`). The shape alone cannot tell the last two
kinds of 2-D output apart, so the batch's token tensor does: an output shaped as `input_ids` is one score per
token, unless the model is a sequence classifier. Padding is the mask of the tokens the output belongs to: the
decoder's own `decoder_attention_mask` for an encoder-decoder's decoder outputs, never the encoder's
`attention_mask` (even when both have the same length), else `attention_mask`.
"""
from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tuner.core.errors import ConfigError
from tuner.core.inputs import ModelInputs

__all__ = ["Layout", "Frame", "frame_of", "IGNORE", "token_ids"]

IGNORE = -100  # a target position that is not scored (transformers' ignore index: padding, the last token)

_TOKEN_KEYS = ("input_ids", "attention_mask")
_DECODER_KEYS = ("decoder_input_ids", "decoder_inputs_embeds", "decoder_attention_mask")


class Layout(str, enum.Enum):
    """Where the scores of a position lie in the compared output."""

    LAST = "last"  # along the last dim: [batch, classes], [batch, tokens, vocab], [batch, tokens, hidden]
    TOKEN_SCORES = "token-scores"  # [batch, tokens]: one binary score (a logit) per token
    PIXELS = "pixels"  # [batch, classes, h, w]: classes along dim 1, one position per pixel


@dataclass(frozen=True)
class Frame:
    """How one batch's output is cut into positions: `mask` [batch, tokens] (0 = padding, left out) and, for
    the loss metrics, `targets`: the token id each position of the logits predicts (IGNORE: not scored)."""

    layout: Layout
    mask: Tensor | None = None
    targets: Tensor | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.layout, Layout):
            raise TypeError(f"layout must be a Layout, not {type(self.layout).__name__}")


def token_ids(batch: ModelInputs) -> Tensor | None:
    """The batch's token ids: `input_ids`, else a model file's one integer positional argument."""
    kwargs = dict(batch.kwargs)
    ids = kwargs.get("input_ids")
    if ids is None and len(batch.args) == 1:
        ids = batch.args[0]
    return ids if isinstance(ids, Tensor) and not ids.dtype.is_floating_point else None


def encoder_decoder(model: Any, kwargs: Mapping[str, Any]) -> bool:
    """Whether the output is a decoder's fed by an encoder (a transformers encoder-decoder, or a batch that
    gives the decoder its own inputs)."""
    config = getattr(model, "config", None)
    return bool(getattr(config, "is_encoder_decoder", False)) or any(k in kwargs for k in _DECODER_KEYS)


def _mask(kwargs: Mapping[str, Any], decoder: bool) -> Tensor | None:
    mask = kwargs.get("decoder_attention_mask" if decoder else "attention_mask")
    return mask if isinstance(mask, Tensor) else None


def _layout(y: Tensor, batch: ModelInputs, model: Any, decoder: bool) -> Layout:
    if y.dim() == 4:
        return Layout.PIXELS
    ids = token_ids(batch)
    tokens = ids if ids is not None else dict(batch.kwargs).get("attention_mask")
    sequence_head = any(word in type(model).__name__ for word in ("Classification", "NextSentence", "MultipleChoice"))
    if (y.dim() == 2 and not decoder and not sequence_head and isinstance(tokens, Tensor)
            and tuple(tokens.shape) == tuple(y.shape)):
        return Layout.TOKEN_SCORES
    return Layout.LAST


def frame_of(y: Tensor, batch: ModelInputs, model: Any, *, output: str | None, loss: bool) -> Frame:
    """The frame of output `y` of `model` on `batch` (`output` the path it was selected by). `loss`: also the
    targets (ConfigError, exit 2, naming what is missing when the model or data give none)."""
    kwargs = dict(batch.kwargs)
    decoder = encoder_decoder(model, kwargs) and not (output or "").startswith("encoder")
    mask = _mask(kwargs, decoder)
    if not loss:
        return Frame(_layout(y, batch, model, decoder), mask)
    return Frame(Layout.LAST, mask, _targets(y, batch, decoder, mask))


def _targets(y: Tensor, batch: ModelInputs, decoder: bool, mask: Tensor | None) -> Tensor:
    """The token each logits position predicts: for a decoder the data's `labels` at the same position; for a
    causal LM the next token (`labels`, else `input_ids`, shifted by one); padding and -100 labels IGNORE."""
    if y.dim() != 3:
        raise ConfigError(f"metric: loss and perplexity score a language model's vocabulary logits [batch, tokens, "
                          f"vocab]; the compared output has shape {list(y.shape)} (name the logits with --output)",
                          fields=("metric",))
    labels = dict(batch.kwargs).get("labels")
    labels = labels if isinstance(labels, Tensor) else None
    if decoder:
        if labels is None:
            raise ConfigError("metric: loss and perplexity of an encoder-decoder score the decoder's tokens: --data "
                              "has no `labels` (the decoder's target token ids); add them", fields=("data",))
        targets = labels.clone()
        if mask is not None and tuple(mask.shape) == tuple(targets.shape):
            targets[mask == 0] = IGNORE
    else:
        ids = labels if labels is not None else token_ids(batch)
        if ids is None:
            raise ConfigError("metric: loss and perplexity score each next token: --data has no `input_ids` (nor "
                              "`labels`) to score", fields=("data",))
        targets = torch.full_like(ids, IGNORE)
        targets[:, :-1] = ids[:, 1:]
        if mask is not None and tuple(mask.shape) == tuple(ids.shape):
            targets[:, :-1][mask[:, 1:] == 0] = IGNORE
    if tuple(targets.shape) != tuple(y.shape[:2]):
        raise ConfigError(f"metric: the logits have {list(y.shape[:2])} [batch, tokens] positions, the token ids "
                          f"{list(targets.shape)}: they must match", fields=("metric",))
    return targets

"""Built-in metrics cut each output into the positions it means: one score per token (a discriminator), a pixel
of a segmentation map, a decoder token under the decoder's own mask; and loss/perplexity score next tokens."""
from __future__ import annotations

import math

import pytest
import torch

from tuner.core.calibration import Calibration
from tuner.core.errors import ConfigError
from tuner.core.inputs import ModelInputs
from tuner.measure.fidelity import Metric
from tuner.workspace.reference import FidelityEvaluate

transformers = pytest.importorskip("transformers")


def _evaluate(metric: Metric, model: torch.nn.Module, batch: dict, output: str | None = None) -> FidelityEvaluate:
    """The metric on one batch, its reference taken from `model` as it is now (the FP32 model)."""
    data = Calibration(describe="batch", digest="", make=lambda: iter([ModelInputs(kwargs=batch)]))
    evaluate = FidelityEvaluate(metric, data, lambda: model, output=output, device="cpu", folder=None)
    evaluate(model)
    return evaluate


def _tokens(batch: int = 3, length: int = 8, vocab: int = 50, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(1, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    mask[2, 3:] = 0
    return ids, mask


def _nudge(module: torch.nn.Module, scale: float = 0.5) -> None:
    """A trial's model: `module`'s weights moved, so some answers change."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=torch.Generator().manual_seed(7)))


def test_a_discriminator_is_judged_per_token_by_the_sign_of_its_score_padding_left_out():
    """ElectraForPreTraining outputs one score per token, [batch, tokens]: agreement counts the unpadded
    tokens whose score keeps its sign (not the argmax over the tokens of each sample)."""
    torch.manual_seed(0)
    config = transformers.ElectraConfig(vocab_size=50, embedding_size=16, hidden_size=16, num_hidden_layers=1,
                                        num_attention_heads=2, intermediate_size=32, max_position_embeddings=16)
    model = transformers.ElectraForPreTraining(config).eval()
    ids, mask = _tokens()
    batch = {"input_ids": ids, "attention_mask": mask}
    evaluate = _evaluate(Metric.AGREEMENT, model, batch)
    with torch.no_grad():
        before = model(**batch).logits
    _nudge(model.discriminator_predictions)
    with torch.no_grad():
        after = model(**batch).logits
    kept = mask.bool()
    expected = float(((before > 0) == (after > 0))[kept].float().mean())
    assert 0 < expected < 1
    assert evaluate(model) == pytest.approx(expected)
    assert evaluate.metric_step == pytest.approx(1 / int(mask.sum()))  # 16 tokens, not 3 samples


def test_a_segmentation_map_is_judged_per_pixel_over_its_classes():
    """Segformer's [batch, classes, h, w] logits: each pixel's top class, not the top column of each row."""
    torch.manual_seed(0)
    config = transformers.SegformerConfig(num_channels=3, num_encoder_blocks=1, depths=[1], sr_ratios=[1],
                                          hidden_sizes=[8], num_attention_heads=[1], patch_sizes=[3], strides=[2],
                                          mlp_ratios=[2], decoder_hidden_size=8, num_labels=5)
    model = transformers.SegformerForSemanticSegmentation(config).eval()
    batch = {"pixel_values": torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))}
    evaluate = _evaluate(Metric.AGREEMENT, model, batch)
    with torch.no_grad():
        before = model(**batch).logits
    _nudge(model.decode_head.classifier, 2.0)
    with torch.no_grad():
        after = model(**batch).logits
    assert before.shape == (2, 5, 8, 8)
    expected = float((before.argmax(1) == after.argmax(1)).float().mean())
    assert 0 < expected < 1
    assert evaluate(model) == pytest.approx(expected)
    assert evaluate.metric_step == pytest.approx(1 / (2 * 8 * 8))


@pytest.fixture(scope="module")
def bart() -> torch.nn.Module:
    """A tiny BART (built once: the metrics never change its weights)."""
    torch.manual_seed(0)
    config = transformers.BartConfig(vocab_size=50, d_model=16, encoder_layers=1, decoder_layers=1,
                                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                     decoder_ffn_dim=32, max_position_embeddings=16)
    return transformers.BartForConditionalGeneration(config).eval()


def test_an_encoder_decoder_is_masked_by_the_decoders_own_mask_never_the_encoders(bart):
    model = bart
    ids, mask = _tokens()
    dec, _ = _tokens(seed=3)
    dec_mask = torch.ones_like(dec)
    dec_mask[0, 6:] = 0
    batch = {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": dec}  # same lengths: 8 and 8
    assert _evaluate(Metric.AGREEMENT, model, batch).metric_step == pytest.approx(1 / dec.numel())
    batch["decoder_attention_mask"] = dec_mask
    assert _evaluate(Metric.AGREEMENT, model, batch).metric_step == pytest.approx(1 / int(dec_mask.sum()))
    batch.pop("decoder_input_ids")  # BART makes its decoder inputs from input_ids: still the decoder's mask
    batch.pop("decoder_attention_mask")
    assert _evaluate(Metric.AGREEMENT, model, batch).metric_step == pytest.approx(1 / ids.numel())
    # the encoder's own output is the encoder's: its attention_mask applies
    encoder = _evaluate(Metric.AGREEMENT, model, batch, output="encoder_last_hidden_state")
    assert encoder.metric_step == pytest.approx(1 / int(mask.sum()))


def test_perplexity_is_the_models_own_next_token_loss_with_padding_left_out():
    """A tiny Llama (GPT-2: tests/cli/test_builtin_metrics.py): transformers' own loss, padding left out."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16)
    model = transformers.LlamaForCausalLM(config).eval()
    ids, mask = _tokens()
    labels = ids.masked_fill(mask == 0, -100)
    with torch.no_grad():
        own = float(model(input_ids=ids, attention_mask=mask, labels=labels).loss)  # transformers' own loss
    batch = {"input_ids": ids, "attention_mask": mask}
    assert _evaluate(Metric.LOSS, model, batch)(model) == pytest.approx(own, rel=1e-5)
    assert _evaluate(Metric.PERPLEXITY, model, batch)(model) == pytest.approx(math.exp(own), rel=1e-5)
    # what the padded positions hold changes nothing
    padded = ids.masked_fill(mask == 0, 7)
    assert _evaluate(Metric.PERPLEXITY, model, {"input_ids": padded, "attention_mask": mask})(model) == \
        pytest.approx(math.exp(own), rel=1e-5)


def test_perplexity_of_an_encoder_decoder_needs_the_decoders_labels(bart):
    model = bart
    ids, mask = _tokens()
    with pytest.raises(ConfigError, match="no `labels`"):
        _evaluate(Metric.PERPLEXITY, model, {"input_ids": ids, "attention_mask": mask})
    labels, _ = _tokens(seed=4)
    labels[0, 6:] = -100
    with torch.no_grad():
        own = float(model(input_ids=ids, attention_mask=mask, labels=labels).loss)
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    assert _evaluate(Metric.PERPLEXITY, model, batch)(model) == pytest.approx(math.exp(own), rel=1e-5)


def test_loss_metrics_refuse_an_output_that_is_not_vocabulary_logits():
    model = torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.Flatten(), torch.nn.Linear(64, 4)).eval()
    data = Calibration(describe="batch", digest="", make=lambda: iter([ModelInputs(args=(_tokens()[0],))]))
    with pytest.raises(ConfigError, match=r"vocabulary logits \[batch, tokens, vocab\]"):
        FidelityEvaluate(Metric.PERPLEXITY, data, lambda: model, output=None, device="cpu", folder=None)(model)

"""Zoo model: a small ViT (transformers ViTForImageClassification, seeded weights); metric: top-1 agreement.

    mpt tune benchmarks/zoo/vit.py --dtype bf16 --tolerance 0.03 --out runs/vit

ViTConfig: 32x32 images, patch 4 (64 patches + [CLS]), hidden 192, 4 layers, 3 heads, intermediate
768, 100 classes (1.8M parameters), the default (sdpa) attention, ViT's init (std 0.02, seed 0)
except for the classifier, which gets std 0.1 so that the logits spread (std about 1) and the top-1
class depends on the image. Called positionally with pixel_values, like a CNN; its output is an
ImageClassifierOutput (a ModelOutput).

Data: 512 fixed images 3x32x32 (seeded smooth random fields plus noise, normalised), 4 batches of
128. Metric: the share of images whose top-1 class equals the FP32 model's (1.0 for the FP32 model;
higher is better).

MPT_ZOO_SIZE=tiny: 16x16 images, patch 4, hidden 32, 2 layers, 2 heads, 10 classes, 32 images.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

import _shared


def config() -> dict:
    if _shared.tiny():
        return {"image": 16, "patch": 4, "hidden": 32, "layers": 2, "heads": 2, "inter": 128, "classes": 10,
                "images": 32, "batch": 32}
    return {"image": 32, "patch": 4, "hidden": 192, "layers": 4, "heads": 3, "inter": 768, "classes": 100,
            "images": 512, "batch": 128}


@functools.lru_cache(maxsize=2)
def _images(n: int, size: int) -> torch.Tensor:
    g = _shared.generator(1)
    coarse = torch.randn(n, 3, 4, 4, generator=g)
    x = F.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)
    x = x + 0.3 * torch.randn(n, 3, size, size, generator=g)
    return (x - x.mean(dim=(0, 2, 3), keepdim=True)) / x.std(dim=(0, 2, 3), keepdim=True)


def data() -> torch.Tensor:
    c = config()
    return _images(c["images"], c["image"])


def build_model() -> nn.Module:
    import transformers

    transformers.logging.set_verbosity_error()
    c = config()
    cfg = transformers.ViTConfig(image_size=c["image"], patch_size=c["patch"], num_channels=3,
                                 hidden_size=c["hidden"], num_hidden_layers=c["layers"],
                                 num_attention_heads=c["heads"], intermediate_size=c["inter"],
                                 num_labels=c["classes"], hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    with _shared.seeded(0):
        model = transformers.ViTForImageClassification(cfg)
        with torch.no_grad():
            nn.init.normal_(model.classifier.weight, std=0.1)
            nn.init.zeros_(model.classifier.bias)
    return model.eval()


def _logits(model: nn.Module) -> list[torch.Tensor]:
    return _shared.batched(model, data(), config()["batch"], lambda m, chunk: m(chunk).logits)


def evaluate(model: nn.Module) -> float:
    """Share of the fixed images whose top-1 class matches the FP32 model's."""
    ref = _shared.reference(f"vit/{_shared.size()}", build_model, _logits, _shared.device_of(model))
    return _shared.agreement(ref, _logits(model))


def example_inputs() -> tuple[torch.Tensor]:
    return (data()[:8].clone(),)

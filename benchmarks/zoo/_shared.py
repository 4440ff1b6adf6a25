"""Shared code of the zoo model files: size switch, seeding, the FP32 reference cache, fidelity metrics, sentences.

Not a model file (the leading underscore). The zoo files import it as `_shared`: mpt puts a model
file's folder on sys.path while it imports the file, and benchmarks/zoo.py's runner does the same.

Every zoo metric compares the model under test with an FP32 reference on fixed data built in the
file. The reference is NOT taken from the model passed to evaluate(): that one may run under a
precision plan (mpt tune attaches one) or hold bf16 weights (tuner.load). Instead `reference()`
builds a second model with the file's own build_model(), runs it once per process in FP32 (torch
autocast and mpt's casts switched off, no_grad), keeps only its outputs (float32, detached) in a
module-level cache and frees the model.

Devices: the data are built on the CPU (seeded CPU generators: the same numbers on every machine) and
moved to the device of the model under test (`device_of(model)`) when it runs; the reference model
is built on that same device (or, when no model is given, on `MPT_ZOO_DEVICE`, which
`benchmarks/zoo.py --device` sets; default cpu), so that `mpt tune --device cuda` and the harness's
runners evaluate on the GPU. build_model() itself stays on the CPU: mpt (and the harness) move the
model to the device after building it.
"""
from __future__ import annotations

import functools

import contextlib
import gc
import os
from typing import Any, Callable, Iterator

import torch
from torch import Tensor

SIZES = ("full", "tiny")


def size() -> str:
    """`MPT_ZOO_SIZE`: "full" (default, the benchmark) or "tiny" (tests/e2e/test_zoo.py: seconds per tune)."""
    value = os.environ.get("MPT_ZOO_SIZE", "full").strip().lower() or "full"
    if value not in SIZES:
        raise ValueError(f"MPT_ZOO_SIZE must be one of {SIZES}, found {value!r}")
    return value


def tiny() -> bool:
    return size() == "tiny"


def default_device() -> torch.device:
    """`MPT_ZOO_DEVICE` ("cpu" by default; benchmarks/zoo.py --device sets it for its children)."""
    return torch.device(os.environ.get("MPT_ZOO_DEVICE", "cpu").strip() or "cpu")


def device_of(model: torch.nn.Module) -> torch.device:
    """Where `model` runs: the device of its first parameter (or buffer), else default_device()."""
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    return default_device()


def to_device(x: Any, device: torch.device | str) -> Any:
    """Tensors (in tuples/lists/dicts) moved to `device` (the same objects when they are there already)."""
    if isinstance(x, Tensor):
        return x.to(device)
    if isinstance(x, (list, tuple)):
        return type(x)(to_device(i, device) for i in x) if not hasattr(x, "_fields") else type(x)(
            *(to_device(i, device) for i in x))
    if isinstance(x, dict):
        return {k: to_device(v, device) for k, v in x.items()}
    return x


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Deterministic RNG inside, and the caller's global RNG state left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@contextlib.contextmanager
def fp32_only(device: torch.device | str = "cpu") -> Iterator[None]:
    """No autocast (torch's, for the CPU and for `device`, or mpt's) and no autograd: how the reference runs."""
    kind = torch.device(device).type
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        stack.enter_context(torch.autocast("cpu", enabled=False))
        if kind != "cpu":
            stack.enter_context(torch.autocast(kind, enabled=False))
        try:
            import tuner

            stack.enter_context(tuner.disable_casts())
        except Exception:  # noqa: BLE001 - mpt absent or older: torch's switch is enough
            pass
        yield


def detached_float(x: Any) -> Any:
    """Tensors (in tuples/lists/dicts) as detached float32 copies; ModelOutputs become plain dicts."""
    if isinstance(x, Tensor):
        t = x.detach()
        return (t.float() if t.is_floating_point() else t).clone()
    if isinstance(x, (list, tuple)):
        return type(x)(detached_float(i) for i in x) if not hasattr(x, "_fields") else type(x)(
            *(detached_float(i) for i in x))
    if isinstance(x, dict):
        return {k: detached_float(v) for k, v in x.items()}
    return x


_REFERENCES: dict[str, Any] = {}


def reference(key: str, build: Callable[[], torch.nn.Module], run: Callable[[torch.nn.Module], Any],
              device: torch.device | str | None = None) -> Any:
    """run(build() on `device`) in FP32, once per process, key and device; the model is freed, its outputs
    (float32, on `device`) are kept.

    `device`: where the model under test runs (pass `device_of(model)`); None: default_device().
    `key` must name everything the outputs depend on (model file, size); the cache is shared by every
    zoo file imported in the process.
    """
    dev = torch.device(device) if device is not None else default_device()
    cache_key = key if dev.type == "cpu" else f"{key}@{dev}"
    if cache_key not in _REFERENCES:
        with fp32_only(dev):
            model = build().to(dev)
            outputs = detached_float(run(model))
        del model
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        _REFERENCES[cache_key] = outputs
    return _REFERENCES[cache_key]


def clear_references() -> None:
    _REFERENCES.clear()


# ----- fidelity metrics (all computed in float64 on float32 copies) ----------------------------------------------
def mean_pool(hidden: Tensor, mask: Tensor) -> Tensor:
    """Sentence-transformers' mean pooling: the mean of the token embeddings where mask is 1."""
    m = mask.to(hidden.device, hidden.dtype).unsqueeze(-1)
    return (hidden * m).sum(dim=-2) / m.sum(dim=-2).clamp(min=1e-9)


def photos(n: int, size: int, seed: int) -> Tensor:
    """Seeded "photos" (n, 3, size, size): a smooth random field (upsampled 8x8 noise) plus fine noise, normalised
    per channel. The CNNs' data (resnet18, unet)."""
    g = generator(seed)
    coarse = torch.randn(n, 3, 8, 8, generator=g)
    smooth = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)
    x = smooth + 0.3 * torch.randn(n, 3, size, size, generator=g)
    return (x - x.mean(dim=(0, 2, 3), keepdim=True)) / x.std(dim=(0, 2, 3), keepdim=True)


@functools.lru_cache(maxsize=4)
def eval_photos(n: int, size: int) -> Tensor:
    """The CNNs' evaluation images: `photos` of seed 1, made once per process (calibration uses seed 2)."""
    return photos(n, size, seed=1)


def calibrate_batchnorm(model: torch.nn.Module, images: Tensor, batch: int) -> torch.nn.Module:
    """Give the model's BatchNorm2d layers running statistics from `images` (seeded calibration data, not the
    evaluation's): the cumulative average over batches of `batch` in train mode, then momentum 0.1 and eval mode,
    as a trained CNN would hold them. The CNNs' build (resnet18, unet)."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    for m in norms:
        m.momentum = None  # cumulative average over the calibration batches
    model.train()
    with torch.no_grad():
        for i in range(0, len(images), batch):
            model(images[i:i + batch])
    for m in norms:
        m.momentum = 0.1
    return model.eval()


def mean_cosine(ref: list[Tensor], outs: list[Tensor]) -> float:
    """Mean cosine similarity of matching rows (over the last dim) across batches: `cosine_sum` pooled."""
    total, count = 0.0, 0
    for r, out in zip(ref, outs, strict=True):
        s, n = cosine_sum(r, out)
        total, count = total + s, count + n
    return total / count


def cosine_sum(ref: Tensor, out: Tensor) -> tuple[float, int]:
    """(sum of cosine similarities between matching rows of ref and out, number of rows), over the last dim."""
    a = ref.detach().double().flatten(0, -2)
    b = out.detach().to(a.device).double().flatten(0, -2)
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1, eps=1e-12)
    return float(cos.sum()), int(cos.numel())


def kl_sum(ref_logits: Tensor, logits: Tensor, mask: Tensor | None = None) -> tuple[float, int]:
    """(sum over positions of KL(P_ref || P) of the softmax distributions over the last dim, positions counted).

    Positions where `mask` is 0 (padding) are left out. A NaN/inf in `logits` gives inf (a failed trial).
    """
    p_log = torch.log_softmax(ref_logits.detach().double(), dim=-1)
    q_log = torch.log_softmax(logits.detach().to(p_log.device).double(), dim=-1)
    kl = (p_log.exp() * (p_log - q_log)).sum(dim=-1)
    if mask is not None:
        keep = mask.to(kl.device).bool()
        kl = kl[keep]
    if not torch.isfinite(kl).all():
        return float("inf"), int(kl.numel())
    return float(kl.sum()), int(kl.numel())


def top1_sum(ref_logits: Tensor, logits: Tensor, mask: Tensor | None = None) -> tuple[int, int]:
    """(positions whose argmax over the last dim agrees with the reference's, positions counted)."""
    same = ref_logits.argmax(dim=-1) == logits.detach().float().argmax(dim=-1).to(ref_logits.device)
    if mask is not None:
        same = same[mask.to(same.device).bool()]
    return int(same.sum()), int(same.numel())


# ----- fixed text for the sentence-embedding model -----------------------------------------------------------------
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar on the street corner.",
    "Interest rates rose for the third time this year.",
    "The cat slept on the warm windowsill all afternoon.",
    "How do I reset my password if I no longer have access to my email?",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "She bought fresh bread, two lemons and a bunch of basil at the market.",
    "The committee postponed its decision until the next meeting.",
    "Our flight was delayed by three hours because of a storm over Chicago.",
    "Quantum computers exploit superposition and entanglement to solve certain problems faster.",
    "He apologised for being late and promised it would not happen again.",
    "The museum's new exhibition features sculptures from the Bronze Age.",
    "Please turn off the lights when you leave the room.",
    "Heavy rain caused flooding in several low-lying neighbourhoods overnight.",
    "The recipe calls for two cups of flour and a pinch of salt.",
    "Stock markets in Asia closed lower after weak manufacturing data.",
    "A group of children are building a sandcastle on the beach.",
    "The software update fixes a bug that drained the battery.",
    "Mount Everest is the highest mountain above sea level.",
    "I think the second chapter of the novel is the most moving.",
    "The train to Edinburgh leaves from platform nine at half past seven.",
    "Regular exercise lowers the risk of heart disease and improves sleep.",
    "The orchestra tuned their instruments before the concert began.",
    "Can you recommend a good restaurant near the train station?",
    "The startup raised twelve million dollars in its latest funding round.",
    "A woman is slicing tomatoes in a small kitchen.",
    "Volcanic eruptions can lower global temperatures for several years.",
    "The defendant pleaded not guilty to all charges.",
    "My grandmother grows roses, tulips and a few stubborn cacti.",
    "The telescope captured images of a galaxy thirteen billion light years away.",
    "Traffic on the motorway was backed up for ten miles after the accident.",
    "The teacher explained long division with a box of colourful beads.",
    "Honey never spoils if it is stored in a sealed container.",
    "The new bridge will connect the island to the mainland by 2030.",
    "He spent the weekend repairing the fence and painting the shed.",
    "Machine translation has improved dramatically over the last decade.",
    "The referee blew the whistle and the crowd erupted in cheers.",
    "Always back up your files before installing a new operating system.",
    "The ancient city was buried under ash for nearly two thousand years.",
    "A dog is running through a field of tall yellow grass.",
    "The pharmacy is closed on Sundays and public holidays.",
    "Electric cars are becoming cheaper as battery prices fall.",
    "They argued about whose turn it was to wash the dishes.",
    "The hurricane weakened to a tropical storm before reaching the coast.",
    "Learning a second language can sharpen memory and attention.",
    "The hotel room had a stunning view of the harbour.",
    "Scientists sequenced the genome of a rare deep-sea octopus.",
    "Please submit your expense reports by Friday afternoon.",
    "The violinist performed the concerto without sheet music.",
    "A cyclist is riding up a steep hill in the rain.",
    "The company recalled thousands of toasters over a fire risk.",
    "We watched the sunset from the top of the lighthouse.",
    "Inflation erodes the purchasing power of savings over time.",
    "The baby laughed every time the puppy sneezed.",
    "Satellites help farmers monitor soil moisture and crop health.",
    "The library extended its opening hours during exam season.",
    "Two men are playing chess in the park under an old oak tree.",
    "This blender is loud, but it makes excellent smoothies.",
    "The senator announced she would not run for re-election.",
    "Glaciers in the Alps have lost a third of their volume since 2000.",
    "Where can I buy a ticket for tonight's football match?",
    "The chef garnished the soup with chopped parsley and cream.",
    "Penguins huddle together to survive the Antarctic winter.",
    "The password must contain at least twelve characters and one symbol.",
]


def batched(model: torch.nn.Module, x: Tensor, batch: int, call: Callable[..., Any] | None = None) -> list[Tensor]:
    """FP32 logits of `model` over `x` in batches (call(model, chunk) picks the logits; default model(chunk)).

    `x` moves to the model's device first."""
    pick = call or (lambda m, chunk: m(chunk))
    x = x.to(device_of(model))
    with torch.no_grad():
        return [pick(model, x[i:i + batch]).float() for i in range(0, len(x), batch)]


def agreement(ref: list[Tensor], outs: list[Tensor], masks: list[Tensor | None] | None = None) -> float:
    """Share of positions (non-padding where masked) whose top-1 matches the FP32 reference's."""
    agree, count = 0, 0
    for r, out, m in zip(ref, outs, masks or [None] * len(ref)):
        a, n = top1_sum(r, out, m)
        agree, count = agree + a, count + n
    return agree / count


@functools.lru_cache(maxsize=2)
def padded_tokens(vocab: int, seqs: int, length: int) -> tuple[Tensor, Tensor]:
    """Seeded token ids of random lengths (padding positions hold token 0) and their attention mask."""
    g = generator(1)
    ids = torch.randint(0, vocab, (seqs, length), generator=g)
    lengths = torch.randint(length // 2, length + 1, (seqs,), generator=g)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    return ids * mask, mask


def lm_logits(model: torch.nn.Module, ids: Tensor, mask: Tensor, batch: int) -> list[Tensor]:
    """An HF causal LM's FP32 logits, called with keyword inputs, in batches (moved to the model's device)."""
    device = device_of(model)
    ids, mask = ids.to(device), mask.to(device)
    with torch.no_grad():
        return [model(input_ids=ids[i:i + batch], attention_mask=mask[i:i + batch]).logits.float()
                for i in range(0, len(ids), batch)]

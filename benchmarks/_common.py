"""Shared helpers for the benchmarks: interleaved timing, markdown tables, the reference models.

Not a benchmark itself (the leading underscore); each benchmarks/*.py script imports it.
"""
from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402


def machine_line() -> str:
    flags = ""
    try:
        text = Path("/proc/cpuinfo").read_text()
        found = [f for f in ("avx512_bf16", "amx_bf16", "avx512_fp16") if f" {f}" in text]
        flags = ", ".join(found) or "no bf16 ISA flags"
    except OSError:
        pass
    return (f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
            f"{platform.machine()}, {flags}, python {platform.python_version()}")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table (left-aligned text, right-aligned numbers)."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]

    def numeric(col: int) -> bool:
        vals = [r[col] for r in cells if r[col] not in ("", "-")]
        def isnum(s: str) -> bool:
            s = s.rstrip("x%").replace(",", "")
            try:
                float(s)
                return True
            except ValueError:
                return False
        return bool(vals) and all(isnum(v) for v in vals)

    right = [numeric(i) for i in range(len(headers))]
    fmt = lambda r: "| " + " | ".join(c.rjust(w) if right[i] else c.ljust(w)  # noqa: E731
                                        for i, (c, w) in enumerate(zip(r, widths))) + " |"
    sep = "|" + "|".join(("-" * (w + 1) + ":") if right[i] else ("-" * (w + 2)) for i, w in enumerate(widths)) + "|"
    return "\n".join([fmt(list(headers)), sep, *(fmt(r) for r in cells)])


def pass_fail(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def calibrate(fn: Callable[[], object], block_seconds: float, warmup_seconds: float = 0.5) -> int:
    """Iterations per timed block so one block takes about `block_seconds`.

    Runs `fn` for `warmup_seconds` first (this VM stalls for up to a second
    or two while fresh memory is paged in, mostly early in a process), then
    uses the median of single-call times, so one stall does not set the count.
    """
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < warmup_seconds or n < 3:
        fn()
        n += 1
    times = []
    for _ in range(7):
        t1 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t1)
    return max(1, int(round(block_seconds / statistics.median(times))))


def interleaved(configs: dict[str, Callable[[], object]], *, rounds: int = 7, block_seconds: float = 0.25,
                iters: int | None = None) -> dict[str, float]:
    """Median (over `rounds`) of the mean seconds per call; configs run ABCD, BCDA, ... each round.

    Every config gets the same iteration count (calibrated on the slowest, so
    blocks stay near `block_seconds`); the starting config rotates per round.
    """
    names = list(configs)
    if iters is None:
        iters = min(calibrate(configs[n], block_seconds) for n in names)
    per_round: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            fn = configs[name]
            fn()  # re-warm after the previous config (caches, allocator)
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            per_round[name].append((time.perf_counter() - t0) / iters)
    interleaved.last_rounds = per_round  # type: ignore[attr-defined]
    return {n: statistics.median(v) for n, v in per_round.items()} | {"__iters__": float(iters)}


def spread(values: list[float]) -> float:
    """Interquartile range / median of the per-round values: the round-to-round noise.

    Robust to a single stalled round (this VM pauses for a second or two now
    and then); the median it is relative to is robust to up to half of them.
    """
    if len(values) < 2:
        return 0.0
    q = statistics.quantiles(values, n=4, method="inclusive")
    med = statistics.median(values)
    return (q[2] - q[0]) / med if med else 0.0


# ----- reference models ----------------------------------------------------------------
D_MODEL, HEADS, FF, LAYERS, SEQ = 256, 4, 1024, 4, 32


def transformer_encoder(*, dropout: float = 0.0, enable_nested_tensor: bool = True, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, FF, dropout=dropout, batch_first=True)
    model = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=enable_nested_tensor)
    return model.eval()


def transformer_inputs(batch: int, seed: int = 1) -> tuple[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, SEQ, D_MODEL, generator=g),)


class SmallCNN(nn.Module):
    """A ResNet-ish CNN for the checkpoint-size table (about 1.2M parameters)."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        ch = [3, 32, 64, 128, 256]
        layers: list[nn.Module] = []
        for cin, cout in zip(ch, ch[1:]):
            layers += [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                       nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                       nn.MaxPool2d(2)]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(ch[-1] * 2 * 2, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


def small_cnn(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return SmallCNN().eval()


def cnn_inputs(batch: int = 8, seed: int = 1) -> tuple[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, 3, 32, 32, generator=g),)


def encoder_path(model: nn.Module, run: Callable[[], object]) -> str:
    """'fused' when nn.TransformerEncoderLayer took torch._transformer_encoder_layer_fwd, else 'unfused'.

    Seen by wrapping that function for one call (transformer.py looks it up on
    the torch module at call time). The profiler is not used: in torch 2.13 a
    profiled run leaves the process measurably slower afterwards.
    """
    original = torch._transformer_encoder_layer_fwd
    calls = [0]

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls[0] += 1
        return original(*args, **kwargs)

    torch._transformer_encoder_layer_fwd = counting  # type: ignore[attr-defined]
    try:
        run()
    finally:
        torch._transformer_encoder_layer_fwd = original  # type: ignore[attr-defined]
    return "fused" if calls[0] else "unfused"

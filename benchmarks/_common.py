"""Shared helpers for the benchmarks: interleaved timing, markdown tables, the reference models.

Not a benchmark itself (the leading underscore); each benchmarks/*.py script imports it.
"""
from __future__ import annotations

import contextlib
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence

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


def child_pythonpath() -> str:
    """The PYTHONPATH of a benchmark's child process: this checkout first, then the caller's. On a machine without
    mpt, gpu_check.sh installs it into a temporary folder on PYTHONPATH: the checkout holds `tuner` but not
    `mpt_cli` (its cli/ folder), so a child given the checkout alone cannot run `mpt` (issue 44)."""
    return os.pathsep.join([str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])


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


@contextlib.contextmanager
def work_folder(keep: Path | None, prefix: str) -> Iterator[Path]:
    """Where a benchmark's child runs write: `keep` (made if missing, left in place for the user to read), else a
    temp folder removed afterwards."""
    if keep is not None:
        folder = keep.resolve()
        folder.mkdir(parents=True, exist_ok=True)
        yield folder
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield Path(tmp)


def pass_fail(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


# Extra rounds (see interleaved) are only run before this monotonic time; scripts set it
# with set_budget() so one run stays within a few minutes even when the box is busy.
_DEADLINE = [math.inf]
NOISY: list[str] = []  # configs whose IQR/median stayed above max_noise


def set_budget(seconds: float) -> None:
    _DEADLINE[0] = time.monotonic() + seconds


def noise_note() -> str:
    if not NOISY:
        return "All timings settled (IQR/median <= 10%)."
    return (f"NOTE: {len(NOISY)} timing(s) stayed noisy (IQR/median > 10%): the box was busy during this run; "
            "ratios from those rows are less trustworthy, rerun to confirm.")


def _fastest_call(fn: Callable[[], object], warmup_seconds: float) -> float:
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
    return min(times)


def calibrate(configs: dict[str, Callable[[], object]], block_seconds: float,
              warmup_seconds: float = 0.3) -> dict[str, int]:
    """Iterations per timed block for each config, so one block takes about `block_seconds`.

    Two passes over the configs, each running a config for `warmup_seconds`
    and then timing single calls; the fastest call seen sets the count. This VM
    stalls for a second or more now and then, and a stall during one pass
    must not set the count.
    """
    best = {name: math.inf for name in configs}
    for _ in range(2):
        for name, fn in configs.items():
            best[name] = min(best[name], _fastest_call(fn, warmup_seconds))
    return {name: max(1, int(round(block_seconds / t))) for name, t in best.items()}


def interleaved(configs: dict[str, Callable[[], object]], *, rounds: int = 7, block_seconds: float = 0.25,
                max_noise: float = 0.10) -> dict[str, float]:
    """Median (over rounds) of the mean seconds per call; configs run ABCD, BCDA, ... each round.

    Each config runs blocks of about `block_seconds` (its own iteration count,
    left in `interleaved.last_iters`); the starting config rotates per round.
    When a config's IQR/median over the rounds exceeds `max_noise` (the box
    was busy), more rounds are run, up to twice `rounds` in all, and only
    while the budget set by set_budget() lasts.
    Per-round values are left in `interleaved.last_rounds`.
    """
    names = list(configs)
    iters = calibrate(configs, block_seconds)
    per_round: dict[str, list[float]] = {n: [] for n in names}
    r = 0
    while r < rounds or (r < 2 * rounds and time.monotonic() < _DEADLINE[0]
                         and any(spread(v) > max_noise for v in per_round.values())):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            fn = configs[name]
            fn()  # re-warm after the previous config (caches, allocator)
            t0 = time.perf_counter()
            for _ in range(iters[name]):
                fn()
            per_round[name].append((time.perf_counter() - t0) / iters[name])
        r += 1
    NOISY.extend(n for n, v in per_round.items() if spread(v) > max_noise)
    interleaved.last_rounds = per_round  # type: ignore[attr-defined]
    interleaved.last_iters = iters  # type: ignore[attr-defined]
    return {n: statistics.median(v) for n, v in per_round.items()}


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

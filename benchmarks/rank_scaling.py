"""Ranking cost: how `--rank exact` and `--rank gradient` scale with the number of candidates, and the memory
the gradient ranking needs.

    .venv/bin/python benchmarks/rank_scaling.py [--sizes 25,50,100,200] [--memory] [--ranking FILE]

Both tables run on --threads torch threads (default 1: with 2 or more, a busy machine stretches every
small op, since OpenMP waits for a descheduled worker, and timings stop meaning anything).

Table 1 (time). Model: a stack of N linear layers (64 -> 64, orthogonal weights, no bias), batch 32; the
candidates are the N linears. Columns: seconds for rank_exact over
all N candidates, that divided by N (seconds per candidate-forward), one forward of the same model under
the engine with all N instance overrides (what each exact pass runs), one plain FP32 forward, and seconds
for rank_gradient. Each is the best of --repeats runs after a warm-up. rank_exact runs N forwards of a
model whose forward costs O(N), so its total is O(N^2) by construction; what the table checks is that the
cost per candidate-forward stays a constant multiple of the forward (no extra per-candidate cost growing
with N), i.e. that "exact s / N" divided by "engine fwd s" stays flat.

Table 2 (--memory, memory). Model: transformers.BertModel(BertConfig(hidden_size=256,
num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)), input_ids of shape (16, 128).
Each row is a fresh subprocess that builds the model, runs one FP32 forward (the reference output),
returns freed memory to the OS (glibc malloc_trim), resets the peak RSS (`/proc/self/clear_refs` 5,
Linux; else the peak so far stays) and measures the increase of
`resource.getrusage(RUSAGE_SELF).ru_maxrss` over one action: an FP32 forward under no_grad (what an
evaluate costs), rank_gradient over all candidates, rank_exact over the first 40. glibc keeps freed
blocks of a few MiB for reuse, so the RSS peak is above the bytes live at any time; run with
MALLOC_MMAP_THRESHOLD_=131072 to see (about) the live bytes instead.

--ranking FILE loads rank_gradient/rank_exact from another copy of tuner/ranking.py (one that imports
`tuner.*` absolutely), to compare versions.
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_line, table  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402

from tuner.engine.function_mode import PrecisionEngine  # noqa: E402
from tuner.core.inputs import ModelInputs  # noqa: E402
from tuner.policy.opnames import is_neutral  # noqa: E402
from tuner.policy.plan import OpInstance  # noqa: E402
from tuner.policy.presets import load_preset  # noqa: E402

DIM, BATCH = 64, 32


def load_ranking(path: str | None) -> Any:
    if not path:
        import tuner.measure.ranking as mod
        return mod
    spec = importlib.util.spec_from_file_location("ranking_under_test", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Stack(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(nn.Linear(DIM, DIM, bias=False) for _ in range(n))
        with torch.no_grad():
            for lin in self.layers:  # orthogonal: the signal neither dies nor explodes (no denormals) at any N
                q, _ = torch.linalg.qr(torch.randn(DIM, DIM))
                lin.weight.copy_(q)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for lin in self.layers:
            x = lin(x)
        return x


def candidates(model: nn.Module, inputs: ModelInputs, policy: Any, dtype: torch.dtype) -> list[OpInstance]:
    """What the tuner's find_candidates keeps: calls computing in the lower dtype, not forced, not neutral."""
    found: list[OpInstance] = []

    def record(d: Any, func: Any, args: tuple, kwargs: dict, out: Any, *raw: Any) -> None:
        if d.lowered and not d.forced and not is_neutral(d.op, args, kwargs):
            found.append(OpInstance(d.module, d.op, d.index))

    with torch.no_grad(), PrecisionEngine(policy, dtype, root=model, recorder=record):
        inputs.call(model)
    return found


def best_of(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def time_table(sizes: list[int], repeats: int, ranking: Any, threads: int) -> None:
    torch.set_num_threads(threads)
    policy, dtype = load_preset("torch-cpu"), torch.bfloat16
    rows = []
    for n in sizes:
        model = Stack(n).eval()
        inputs = ModelInputs.of((torch.randn(BATCH, DIM, generator=torch.Generator().manual_seed(1)),))
        cands = candidates(model, inputs, policy, dtype)
        with torch.no_grad():
            ref = inputs.call(model)
        overrides = {c.key(): torch.float32 for c in cands}

        def engine_forward() -> None:
            with torch.no_grad(), PrecisionEngine(policy, dtype, root=model, instance_overrides=overrides):
                inputs.call(model)

        def plain_forward() -> None:
            with torch.no_grad():
                inputs.call(model)

        def exact() -> None:
            ranking.rank_exact(model, inputs.args, policy, dtype, cands, ref)

        def gradient() -> None:
            ranking.rank_gradient(model, inputs.args, policy, dtype, cands, ref)

        for fn in (engine_forward, exact, gradient):  # warm-up
            fn()
        t_exact = best_of(exact, repeats)
        t_fwd = best_of(engine_forward, max(repeats, 5))
        t_plain = best_of(plain_forward, max(repeats, 5))
        t_grad = best_of(gradient, repeats)
        rows.append([n, len(cands), f"{t_exact:.3f}", f"{t_exact / len(cands) * 1e3:.2f}",
                     f"{t_fwd * 1e3:.2f}", f"{t_exact / len(cands) / t_fwd:.2f}", f"{t_plain * 1e3:.3f}",
                     f"{t_grad:.3f}"])
        print(f"  N={n} done", file=sys.stderr, flush=True)
    print("\n### Table 1: ranking time against the number of candidates (stack of N linears)\n")
    print(table(["N", "candidates", "exact s", "exact ms / candidate", "engine fwd ms", "per-candidate / fwd",
                 "FP32 fwd ms", "gradient s"], rows))


# ----- memory (fresh subprocesses) ------------------------------------------------------------------------
BERT = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)


def _peak_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _trim() -> None:
    """Give the memory freed so far back to the OS (glibc), so that the set-up's freed buffers are not reused
    by the measured action and hide part of its cost."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def memory_child(action: str, ranking_path: str | None, threads: int) -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(threads)
    ranking = load_ranking(ranking_path)
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(**BERT)).eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (16, 128), generator=g)
    inputs = ModelInputs.of((ids,))  # positional: older rankings take a tuple
    policy, dtype = load_preset("torch-cpu"), torch.bfloat16
    cands = candidates(model, inputs, policy, dtype)
    with torch.no_grad():
        ref = inputs.call(model)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    gc.collect()
    _trim()
    reset = _reset_peak()
    before = _peak_kib()
    t0 = time.perf_counter()
    if action == "fp32":
        with torch.no_grad():
            out = inputs.call(model)
        del out
    elif action == "gradient":
        ranking.rank_gradient(model, inputs.args, policy, dtype, cands, ref)
    elif action == "exact40":
        ranking.rank_exact(model, inputs.args, policy, dtype, cands[:40], ref)
    secs = time.perf_counter() - t0
    after = _peak_kib()
    print(json.dumps({"action": action, "increase_mib": (after - before) / 1024, "before_mib": before / 1024,
                      "params_mib": params / 2**20, "candidates": len(cands), "seconds": secs, "reset": reset}))


def memory_table(ranking_path: str | None, threads: int) -> None:
    rows = []
    base = None
    for action in ("fp32", "gradient", "exact40"):
        cmd = [sys.executable, __file__, "--child", action, "--threads", str(threads)]
        if ranking_path:
            cmd += ["--ranking", ranking_path]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            print(res.stderr, file=sys.stderr)
            rows.append([action, "failed", "", "", ""])
            continue
        r = json.loads(res.stdout.strip().splitlines()[-1])
        if action == "fp32":
            base = r["increase_mib"]
        ratio = f"{r['increase_mib'] / base:.1f}x" if base else "-"
        rows.append([action, f"{r['increase_mib']:.0f}", ratio, f"{r['increase_mib'] / r['params_mib']:.2f}x",
                     f"{r['seconds']:.2f}"])
        params, ncands, reset = r["params_mib"], r["candidates"], r["reset"]
    print(f"\n### Table 2: peak RSS increase (MiB), BertModel {BERT}, input_ids (16, 128), "
          f"{params:.0f} MiB of parameters, {ncands} candidates"
          f"{'' if reset else ' (peak could not be reset: increases are over the set-up peak)'}\n")
    print(table(["action", "peak increase MiB", "vs FP32 forward", "vs parameters", "seconds"], rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="25,50,100,200")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--memory", action="store_true", help="also run the memory table (BertModel, subprocesses)")
    ap.add_argument("--memory-only", action="store_true")
    ap.add_argument("--ranking", default=None, help="a copy of tuner/ranking.py to measure instead")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        memory_child(args.child, args.ranking, args.threads)
        return
    print(machine_line())
    print(f"CPU capability: {torch.backends.cpu.get_cpu_capability()}"
          + (f"; ranking from {args.ranking}" if args.ranking else ""))
    if not args.memory_only:
        time_table([int(s) for s in args.sizes.split(",")], args.repeats, load_ranking(args.ranking), args.threads)
    if args.memory or args.memory_only:
        memory_table(args.ranking, args.threads)


if __name__ == "__main__":
    main()

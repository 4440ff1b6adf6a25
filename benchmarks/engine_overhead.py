"""Engine overhead: forward-pass wall time of an nn.TransformerEncoder under each way of running bf16.

    .venv/bin/python benchmarks/engine_overhead.py [--rounds 7] [--block 0.4] [--quick]

Model: nn.TransformerEncoder, d_model 256, 4 heads, ff 1024, 4 layers, seq 32,
batch_first, under torch.no_grad(); batch 1 and batch 64. Configs:

  torch.autocast   `with torch.autocast("cpu", torch.bfloat16): model(x)`           (the reference)
  mpt auto         `with tuner.autocast("torch-cpu", "bf16"): model(x)`            (what users get)
  mpt python       `with tuner.autocast("torch-cpu", "bf16", engine="python"): ...` (mpt's TorchFunctionMode)
  fp32             `model(x)`

The context is constructed inside the timed loop, as user code writes it.
Timing: R rounds; in each round every config runs one block of about
--block seconds (N calls, N set per config from its fastest call after a
warm-up; order rotated per round: ABCD, BCDA, ...); the table reports the median
over rounds of the mean time per call, and IQR/median of the per-round
means (round-to-round noise; a large value means the box was busy: rerun).
When a config's IQR/median is above 10% after R rounds, up to R more rounds
are run (the "rounds x iters" column says how many). This VM also stalls for
a second or more now and then; the median over rounds keeps a stalled round
from counting, and the iteration count is calibrated on the fastest call.

Section 1 runs the model in eval mode, where nn.TransformerEncoderLayer may
take its fused fast path (torch._transformer_encoder_layer_fwd). Its
"autocast is enabled" check calls torch.is_autocast_enabled(), which looks at
CUDA autocast only, so CPU torch.autocast (and mpt auto, which is
torch.autocast) still takes the fused path; mpt's python engine does not (a
TorchFunctionMode makes "some Tensor argument has_torch_function" true). The
"path" column says which one each config took (seen by wrapping
torch._transformer_encoder_layer_fwd for one call). enable_nested_tensor does
not matter here: it only acts when a src_key_padding_mask is passed. Section 2 runs the same weights in train mode with dropout 0
(same math, fast path off for every config), so all configs run the same
unfused kernels.

Targets (section 1, mpt auto vs torch.autocast): <= 1.05x at batch 64, <= 1.3x at batch 1.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (encoder_path, interleaved, machine_line, noise_note, pass_fail, set_budget,  # noqa: E402
                     spread, table, transformer_encoder, transformer_inputs)

import torch  # noqa: E402

import tuner  # noqa: E402

TARGETS = {64: 1.05, 1: 1.3}


def configs(model: torch.nn.Module, x: torch.Tensor) -> dict:
    def ref() -> object:
        with torch.autocast("cpu", torch.bfloat16):
            return model(x)

    def auto() -> object:
        with tuner.autocast("torch-cpu", "bf16"):
            return model(x)

    def python() -> object:
        with tuner.autocast("torch-cpu", "bf16", engine="python"):
            return model(x)

    def fp32() -> object:
        return model(x)

    return {"torch.autocast": ref, "mpt auto (torch-cpu)": auto, "mpt python engine": python, "fp32": fp32}


def section(title: str, *, train_mode: bool, rounds: int, block: float, batches: list[int]) -> dict:
    model = transformer_encoder(dropout=0.0)
    if train_mode:
        model.train()  # dropout is 0: same math, but the fused fast path is off
    rows = []
    ratios: dict[int, dict[str, float]] = {}
    with torch.no_grad():
        for batch in batches:
            (x,) = transformer_inputs(batch)
            cfg = configs(model, x)
            paths = {name: encoder_path(model, fn) for name, fn in cfg.items()}
            # Check the configs compute the same thing (auto must match torch.autocast bitwise).
            outs = {name: fn() for name, fn in cfg.items()}
            res = interleaved(cfg, rounds=rounds, block_seconds=block)
            iters = interleaved.last_iters  # type: ignore[attr-defined]
            per_round = interleaved.last_rounds  # type: ignore[attr-defined]
            ref = res["torch.autocast"]
            ratios[batch] = {}
            for name, secs in res.items():
                ratio = secs / ref
                ratios[batch][name] = ratio
                diff = (outs[name].float() - outs["torch.autocast"].float()).abs().max().item()
                rows.append([batch, name, paths[name], f"{secs * 1e3:.3f}", f"{ratio:.3f}x", f"{diff:.1e}",
                             f"{spread(per_round[name]):.0%}", f"{len(per_round[name])}x{iters[name]}"])
    print(f"\n### {title}\n")
    print(table(["batch", "config", "path", "ms/forward (median)", "vs torch.autocast",
                 "max abs diff vs autocast", "IQR/median", "rounds x iters"], rows))
    return ratios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--block", type=float, default=0.4, help="seconds per timed block (default 0.4)")
    ap.add_argument("--quick", action="store_true", help="5 rounds of 0.1 s blocks (smoke run)")
    args = ap.parse_args()
    set_budget(180)  # extra rounds for noisy timings stop after this many seconds
    if args.quick:
        args.rounds, args.block = 5, 0.1
    batches = [1, 64]
    print("## engine_overhead: nn.TransformerEncoder (d256, 4 heads, ff1024, 4 layers, seq 32), no_grad")
    print(machine_line())
    s1 = section("Section 1: eval mode (fused encoder fast path allowed)", train_mode=False,
                 rounds=args.rounds, block=args.block, batches=batches)
    s2 = section("Section 2: train mode, dropout 0 (fast path off for every config; same math)",
                 train_mode=True, rounds=args.rounds, block=args.block, batches=batches)
    print("\n### Targets (section 1: mpt auto vs torch.autocast)\n")
    rows = []
    for batch in (64, 1):
        r = s1[batch]["mpt auto (torch-cpu)"]
        rows.append([f"batch {batch}: mpt auto <= {TARGETS[batch]:.2f}x torch.autocast", f"{r:.3f}x",
                     pass_fail(r <= TARGETS[batch])])
    for batch in (64, 1):
        r = s2[batch]["mpt auto (torch-cpu)"]
        rows.append([f"(section 2) batch {batch}: mpt auto <= {TARGETS[batch]:.2f}x", f"{r:.3f}x",
                     pass_fail(r <= TARGETS[batch])])
    print(table(["target", "measured", "result"], rows))
    py = {b: s1[b]["mpt python engine"] for b in batches}
    print(f"\n(no target) mpt python engine vs torch.autocast: batch 1 {py[1]:.2f}x, batch 64 {py[64]:.2f}x")
    print(noise_note())


if __name__ == "__main__":
    main()

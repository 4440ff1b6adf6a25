"""What a tune costs a GPU user: a LLaMA-shaped Hugging Face decoder tuned with `--metric kl` (issue 33).

    python benchmarks/gpu_tune.py                        # 1.1B in bf16 and fp16, then 8B where the GPU holds it
    python benchmarks/gpu_tune.py --shapes 1b --dtypes bf16
    python benchmarks/gpu_tune.py --device cpu --shapes tiny --batch 2 --tokens 16   # a smoke run on a CPU

Each tune is `mpt tune benchmarks/gpu/hf_llama.py --metric kl --data DATA --device DEVICE --dtype D` in a fresh
process (random seeded init on the device: TinyLlama-1.1B's shape, Llama-3-8B's), on `--batch` x `--tokens`
random token ids. Per tune: wall time, the time inside evaluate and mpt's own time (the wall time less the
evaluations and the user's `build_model()`), by phase (report.json's `seconds.phases`), evaluations, the bf16/fp16 share of matmul/conv FLOPs, peak GPU memory (torch's allocator)
against the FP32 weights. Then the tuned 1.1B plan's forward (8 x 512 tokens) against `torch.autocast` and
against the same FP32 regions written by hand.

Targets: the 1.1B bf16 tune's wall <= 30 s with mpt's own time <= 25% of it; the 8B tune's peak GPU memory
<= 1.5x its FP32 weights; an all-low plan's forward <= 1.03x torch.autocast; a plan with FP32 regions <= 1.05x
the hand-written equivalent.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "benchmarks" / "gpu" / "hf_llama.py"
sys.path[:0] = [str(ROOT / "benchmarks"), str(MODEL.parent)]  # _common, and hf_llama for the forward timings
from _common import child_pythonpath, pass_fail, table  # noqa: E402

WALL_S, OWN_SHARE, PEAK_X, AUTOCAST_X, HAND_X = 30.0, 0.25, 1.5, 1.03, 1.05

CHILD = """import json, sys, torch
from mpt_cli.main import main
code = 0
try:
    main(sys.argv[2:], standalone_mode=False)
except SystemExit as exc:
    code = int(exc.code or 0)
peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
open(sys.argv[1], "w").write(json.dumps({"code": code, "peak": peak}))
"""


def tune(shape: str, dtype: str, args: argparse.Namespace, work: Path) -> dict:
    """One `mpt tune` in a fresh process: its wall time, report.json and peak GPU memory."""
    out, stats = work / f"out-{shape}-{dtype}", work / f"stats-{shape}-{dtype}.json"
    env = {**os.environ, "MPT_GPU_SHAPE": shape, "MPT_GPU_DEVICE": args.device, "PYTHONPATH": child_pythonpath()}
    cmd = [sys.executable, "-c", CHILD, str(stats), "tune", str(MODEL), "--metric", "kl", "--data",
           str(work / "data.safetensors"), "--device", args.device, "--dtype", dtype, "--out", str(out),
           "--overwrite", "--no-latency", "-q", *args.mpt_args]
    t0 = time.monotonic()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if done.returncode != 0 or not stats.exists():
        print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
        return {"shape": shape, "dtype": dtype, "code": done.returncode, "wall": wall}
    report = json.loads((out / "report.json").read_text())
    return {"shape": shape, "dtype": dtype, "code": json.loads(stats.read_text())["code"], "wall": wall,
            "peak": json.loads(stats.read_text())["peak"], "report": report, "out": out}


def fp32_bytes(shape: str) -> int:
    """Bytes of the model's FP32 weights, from a model built on the meta device (no memory)."""
    os.environ["MPT_GPU_SHAPE"], os.environ["MPT_GPU_DEVICE"] = shape, "meta"
    import hf_llama

    return sum(p.numel() * 4 for p in hf_llama.build_model().parameters())


def tune_rows(results: list[dict], args: argparse.Namespace) -> tuple[list, list, bool]:
    rows, phase_rows, ok = [], [], True
    for r in results:
        if "report" not in r:
            rows.append([r["shape"], r["dtype"], r["code"], f"{r['wall']:.1f}", *["-"] * 7])
            ok = False
            continue
        seconds = r["report"]["seconds"]
        own = r["wall"] - seconds["evaluations"] - seconds["user_code"]  # the user's build_model() is not mpt's
        weights = fp32_bytes(r["shape"])
        good = True
        if r["shape"] == "1b" and r["dtype"] == "bf16":
            good = r["wall"] <= WALL_S and own / r["wall"] <= OWN_SHARE
        if r["shape"] == "8b":
            good = r["peak"] <= PEAK_X * weights
        ok &= good and r["code"] == 0
        rows.append([r["shape"], r["dtype"], r["code"], f"{r['wall']:.1f}", f"{seconds['evaluations']:.1f}",
                     f"{own:.1f}", f"{100 * own / r['wall']:.0f}%", r["report"]["evaluations"],
                     f"{100 * r['report']['low_precision_flop_share']:.1f}%",
                     f"{r['peak'] / 2**30:.1f} ({r['peak'] / weights:.2f}x)", pass_fail(good)])
        for phase, split in seconds["phases"].items():
            phase_rows.append([r["shape"], r["dtype"], phase, f"{split['own']:.2f}", f"{split['evaluate']:.2f}"])
        rest = own - sum(split["own"] for split in seconds["phases"].values())
        phase_rows.append([r["shape"], r["dtype"], "process start, imports, between phases", f"{rest:.2f}", "-"])
        phase_rows.append([r["shape"], r["dtype"], "(the user's build_model(), not counted)",
                           f"{seconds['user_code']:.2f}", "-"])
    return rows, phase_rows, ok


def timed(fn, rounds: int) -> float:
    """The median seconds of `fn()` over `rounds` calls (after two warm-up calls), synchronized."""
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(2):
        fn()
    sync()
    took = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        sync()
        took.append(time.perf_counter() - t0)
    return statistics.median(took)


def forward_rows(args: argparse.Namespace, shape: str, dtype_name: str) -> tuple[list, bool]:
    """The tuned plan's forward, an all-low plan and one with every down_proj FP32, against their equivalents."""
    import torch

    import tuner

    os.environ["MPT_GPU_SHAPE"], os.environ["MPT_GPU_DEVICE"] = shape, args.device
    import hf_llama

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    model = hf_llama.build_model()
    ids = torch.randint(0, model.config.vocab_size, (args.forward_batch, args.tokens), device=args.device)
    preset = f"torch-{torch.device(args.device).type}"
    downs = [name for name, _ in model.named_modules() if name.endswith("mlp.down_proj")]
    with torch.no_grad():
        autocast = timed(lambda: _autocast(model, ids, args.device, dtype), args.rounds)
        hand = timed(lambda: _hand_written(model, ids, args.device, dtype, downs), args.rounds)
        low_plan = tuner.Plan(dtype=dtype_name, preset=preset)
        regions = tuner.Plan(dtype=dtype_name, preset=preset,
                             fp32_instances=tuple(tuner.OpInstance(d, "linear", 0) for d in downs))
        tuner.attach(model, low_plan)  # once, as tuner.load does: the forward is what is timed
        low = timed(lambda: model(input_ids=ids), args.rounds)
        tuner.attach(model, regions)
        fp32 = timed(lambda: model(input_ids=ids), args.rounds)
        tuner.detach(model)
    good_low, good_fp32 = low <= AUTOCAST_X * autocast, fp32 <= HAND_X * hand
    rows = [["all-low plan", f"{1e3 * low:.1f}", "torch.autocast", f"{1e3 * autocast:.1f}", f"{low / autocast:.3f}x",
             f"<= {AUTOCAST_X}x", pass_fail(good_low)],
            [f"{len(downs)} down_proj FP32 regions", f"{1e3 * fp32:.1f}", "hand-written", f"{1e3 * hand:.1f}",
             f"{fp32 / hand:.3f}x", f"<= {HAND_X}x", pass_fail(good_fp32)]]
    return rows, good_low and good_fp32


def _autocast(model, ids, device, dtype):
    import torch

    with torch.autocast(torch.device(device).type, dtype=dtype, cache_enabled=False):
        return model(input_ids=ids)


def _hand_written(model, ids, device, dtype, downs):
    """torch.autocast with each down_proj's forward in FP32, written as a user would: hooks that switch."""
    import torch

    kind = torch.device(device).type
    mods = dict(model.named_modules())
    saved = {}
    for name in downs:
        mod = mods[name]
        saved[name] = mod.forward

        def fp32_forward(x, _forward=mod.forward):
            with torch.autocast(kind, enabled=False):
                return _forward(x.float())

        mod.forward = fp32_forward
    try:
        return _autocast(model, ids, device, dtype)
    finally:
        for name in downs:
            del mods[name].forward


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shapes", nargs="+", default=["1b", "8b"], choices=["tiny", "1b", "8b"])
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "fp16"])
    ap.add_argument("--batch", type=int, default=32, help="calibration sequences")
    ap.add_argument("--tokens", type=int, default=512, help="tokens per sequence")
    ap.add_argument("--forward-batch", type=int, default=8, help="sequences per timed forward")
    ap.add_argument("--rounds", type=int, default=10, help="timed forwards per configuration")
    ap.add_argument("--mpt-args", nargs=argparse.REMAINDER, default=[], help="more `mpt tune` options (last)")
    args = ap.parse_args()
    import torch
    from safetensors.torch import save_file

    card = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(f"# gpu_tune: {card}, torch {torch.__version__}\n")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        vocab = {"tiny": 512, "1b": 32000, "8b": 128256}
        results = []
        for shape in args.shapes:
            ids = torch.randint(0, vocab[shape], (args.batch, args.tokens), generator=torch.Generator().manual_seed(1))
            save_file({"input_ids": ids}, work / "data.safetensors")
            dtypes = args.dtypes if shape != "8b" else args.dtypes[:1]
            for dtype in dtypes:
                if shape == "8b" and args.device.startswith("cuda") and \
                        torch.cuda.mem_get_info()[1] < 1.6 * fp32_bytes(shape):
                    print(f"8b: skipped, the GPU holds {torch.cuda.mem_get_info()[1] / 2**30:.0f} GiB", file=sys.stderr)
                    continue
                results.append(tune(shape, dtype, args, work))
                print(f"{shape} {dtype}: done in {results[-1]['wall']:.0f} s", file=sys.stderr)
        rows, phase_rows, ok = tune_rows(results, args)
    print(table(["model", "dtype", "exit", "wall s", "in evaluate s", "mpt own s", "own share", "evaluations",
                 "low FLOP share", "peak GPU GiB (x FP32 weights)", "target"], rows))
    print("\nmpt's own time by phase (report.json seconds.phases):\n")
    print(table(["model", "dtype", "phase", "own s", "in evaluate s"], phase_rows))
    shape = "1b" if "1b" in args.shapes else args.shapes[0]
    frows, fok = forward_rows(args, shape, args.dtypes[0])
    print(f"\nforward of {args.forward_batch} x {args.tokens} tokens, {shape}, {args.dtypes[0]} (median of "
          f"{args.rounds}):\n")
    print(table(["mpt", "ms", "against", "ms", "ratio", "target", "result"], frows))
    ok &= fok
    print(f"\n**{'all targets met' if ok else 'some targets FAIL'}**")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

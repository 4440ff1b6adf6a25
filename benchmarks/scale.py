"""How mpt's own time and memory grow with the model: a LLaMA-shaped LM (benchmarks/scale/llama_model.py,
TinyLlama-1.1B's width, random seeded init, no download) tuned at several depths.

Per depth it runs, each in a fresh process:
1. the FP32 reference: a process that builds the model and runs its evaluate once (peak RSS, seconds);
2. `mpt tune llama_model.py --dtype bf16` (peak RSS, wall time), with mpt's phases timed from inside
   (exclusive time in the functions below, so nested phases are not counted twice).
The model file logs the seconds of every `build_model()` and `evaluate()` itself, so "mpt's own time" is the
wall time of the tune process minus the user's build and evaluate time, as the user would count it (process
start and imports included). Targets (issue 20): mpt's own time <= 15% of the tune, peak RSS <= 1.15x the
FP32 reference process.

    python benchmarks/scale.py                      # 4, 16 and 22 layers (1.1B) of TinyLlama's width
    python benchmarks/scale.py --layers 4 --hidden 512 --mlp 1408 --vocab 4000   # a quick run
    python benchmarks/scale.py --layers 22 --batches 36 --fsdp 2   # FSDP2 over 2 gloo ranks under torchrun
    python benchmarks/scale.py --layers 22 --device cuda            # on a GPU (RSS is then the host's)

With `--fsdp N` both processes run under torchrun on N ranks (MPT_SCALE_SHARD=fsdp: every layer sharded with
FSDP2, the batches split over the ranks); the times are rank 0's phases and the ranks' mean build/evaluate,
the peak RSS the largest rank's.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "benchmarks" / "scale" / "llama_model.py"
sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import child_pythonpath, machine_line, pass_fail, table  # noqa: E402

OWN_TARGET, RSS_TARGET = 0.15, 1.15

# (phase, module, attribute path): mpt's functions timed exclusively in the child process.
PHASES = [
    ("weights fingerprint", "tuner.core.fingerprint", "ModelState.capture"),
    ("candidates + autocast probe", "tuner.search.session", "TuneSession.find_candidates"),
    ("ranking", "tuner.search.session", "TuneSession.rank"),
    ("FP32 count + plan record (one recorded forward)", "tuner.search.session", "TuneSession._record"),
    ("confirm lowered weights", "tuner.search.evaluator", "Evaluator.confirm_lowered"),
    ("trial setup (deployed model)", "tuner.search.evaluator", "Evaluator._deployed"),
    ("lowered weights held (pack)", "tuner.measure.held", "HeldLowered.match"),
    ("lowered weights put back (unpack)", "tuner.measure.held", "HeldLowered.release"),
    ("guide forwards (search)", "tuner.search.guide", "Guide.error"),
    ("latency", "tuner.report.latency", "compare_latency"),
    ("outputs (checkpoint, plan pass, checks)", "tuner.report.writer", "write_outputs"),
    ("report measuring", "tuner.report.measuring", "measure_report"),
]


def child(argv: list[str]) -> int:
    """Run `mpt` in this process with PHASES timed; the timings go to MPT_SCALE_PHASES as JSON."""
    import contextlib
    import functools
    import importlib

    spent: dict[str, float] = {}
    stack: list[list[float]] = []
    peaks: dict[str, float] = {}  # phase -> the peak RSS (GiB) this process had reached when it first rose in it

    def rss() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20

    def timed(name, fn):
        @functools.wraps(fn)
        def wrapper(*a, **k):
            stack.append([time.monotonic(), 0.0])
            before = rss()
            try:
                return fn(*a, **k)
            finally:
                if rss() > before:
                    peaks[name] = max(peaks.get(name, 0.0), rss())
                start, nested = stack.pop()
                took = time.monotonic() - start
                spent[name] = spent.get(name, 0.0) + took - nested
                if stack:
                    stack[-1][1] += took
        return wrapper

    def timed_cm(name, fn):  # a @contextmanager: time the whole with-block's setup and teardown, not its body
        @functools.wraps(fn)
        @contextlib.contextmanager
        def wrapper(*a, **k):
            t0 = time.monotonic()
            cm = fn(*a, **k)
            value = cm.__enter__()
            spent[name] = spent.get(name, 0.0) + time.monotonic() - t0
            try:
                yield value
            finally:
                t1 = time.monotonic()
                cm.__exit__(*sys.exc_info())
                spent[name] = spent.get(name, 0.0) + time.monotonic() - t1
        return wrapper

    for name, module, attr in PHASES:
        mod = importlib.import_module(module)
        owner_name, _, fn_name = attr.rpartition(".")
        owner = getattr(mod, owner_name) if owner_name else mod
        fn = getattr(owner, fn_name)
        wrap = timed_cm if fn_name == "_deployed" else timed
        setattr(owner, fn_name, classmethod(wrap(name, fn.__func__)) if isinstance(
            owner.__dict__.get(fn_name), classmethod) else wrap(name, fn))
        if not owner_name:  # module-level functions imported by name elsewhere
            for other in list(sys.modules.values()):
                if other is not None and getattr(other, fn_name, None) is fn and other.__name__.startswith("tuner"):
                    setattr(other, fn_name, getattr(owner, fn_name))
    from mpt_cli.main import main

    try:
        main(argv, standalone_mode=False)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    rank = os.environ.get("RANK", "0")
    Path(os.environ["MPT_SCALE_PHASES"] + ("" if rank == "0" else f".{rank}")).write_text(
        json.dumps({"seconds": spent, "peaks": peaks}))
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # a torchrun rank ends as `mpt` does (cli/main.py)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def measured(cmd: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """(wall seconds, peak RSS in GiB, exit code) of `cmd` in a fresh process (RSS of that process alone)."""
    probe = ("import resource, subprocess, sys, time; t = time.monotonic(); "
             "rc = subprocess.run(sys.argv[1:]).returncode; "
             "print(time.monotonic() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, rc)")
    out = subprocess.run([sys.executable, "-c", probe, *cmd], env=env, capture_output=True, text=True)
    if out.returncode != 0 or not out.stdout.strip():
        raise SystemExit(f"{cmd}: {out.stderr[-2000:]}")
    wall, rss_kb, rc = out.stdout.split()[-3:]
    return float(wall), int(rss_kb) / 2**20, int(rc)


def user_seconds(times: Path) -> dict[str, float]:
    """The user's build and evaluate seconds (the mean over the processes that logged them: the ranks) and
    the number of evaluate calls (every rank calls it as often; the most any process made)."""
    per: dict[int, dict[str, float]] = {}
    for line in times.read_text().splitlines() if times.exists() else []:
        rec = json.loads(line)
        found = per.setdefault(rec["pid"], {"build": 0.0, "evaluate": 0.0, "evaluations": 0})
        found[rec["kind"]] += rec["seconds"]
        found["evaluations"] += rec["kind"] == "evaluate"
    if not per:
        return {"build": 0.0, "evaluate": 0.0, "evaluations": 0}
    mean = {key: sum(f[key] for f in per.values()) / len(per) for key in ("build", "evaluate")}
    return {**mean, "evaluations": max(int(f["evaluations"]) for f in per.values())}


REF = """import os, sys
sys.path.insert(0, sys.argv[1])
if int(os.environ.get("WORLD_SIZE", "1")) > 1:
    import torch.distributed as dist
    dist.init_process_group("gloo")
import llama_model as m
m.evaluate(m.build_model().to(os.environ.get("MPT_SCALE_DEVICE", "cpu")))
sys.stdout.flush()
os._exit(0)
"""


def launcher(args: argparse.Namespace) -> list[str]:
    """How a process starts: plain python, or torchrun on `--fsdp` ranks."""
    if not args.fsdp:
        return [sys.executable]
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.fsdp), "--master-port",
            str(port)]


def one_depth(layers: int, args: argparse.Namespace, work: Path) -> dict:
    env = {**os.environ, "MPT_SCALE_LAYERS": str(layers), "MPT_SCALE_HIDDEN": str(args.hidden),
           "MPT_SCALE_MLP": str(args.mlp), "MPT_SCALE_VOCAB": str(args.vocab), "MPT_SCALE_TOKENS": str(args.tokens),
           "MPT_SCALE_BATCHES": str(args.batches), "MPT_SCALE_DEVICE": args.device, "PYTHONPATH": child_pythonpath()}
    if args.fsdp:
        env.update(MPT_SCALE_SHARD="fsdp", OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // args.fsdp)))
    ref_times = work / f"ref-{layers}.jsonl"
    (work / "ref.py").write_text(REF)
    ref_cmd = [*launcher(args), str(work / "ref.py"), str(MODEL.parent)]
    ref_wall, ref_rss, _ = measured(ref_cmd, {**env, "MPT_SCALE_TIMES": str(ref_times)})
    times, phases = work / f"tune-{layers}.jsonl", work / f"phases-{layers}.json"
    cmd = [*launcher(args), __file__, "--child", "tune", str(MODEL), "--dtype", "bf16", "--tolerance",
           str(args.tolerance), "--device", args.device, "--out", str(work / f"out-{layers}"), *args.mpt_args]
    wall, rss, rc = measured(cmd, {**env, "MPT_SCALE_TIMES": str(times), "MPT_SCALE_PHASES": str(phases)})
    user = user_seconds(times)
    report = json.loads((work / f"out-{layers}" / "report.json").read_text()) if rc == 0 else {}
    own = wall - user["build"] - user["evaluate"]
    return {"layers": layers, "params": None, "rc": rc, "wall": wall, "evaluate": user["evaluate"],
            "build": user["build"], "own": own, "own_share": own / wall, "rss": rss, "ref_rss": ref_rss,
            "ref_eval": user_seconds(ref_times)["evaluate"], "evals": user["evaluations"],
            "candidates": report.get("candidates"), "share": report.get("low_precision_flop_share"),
            **(json.loads(phases.read_text()) if phases.exists() else {"seconds": {}, "peaks": {}})}


def params(layers: int, a: argparse.Namespace) -> float:
    kv = max(1, a.hidden // 512) * 64
    per_layer = a.hidden * (2 * a.hidden + 2 * kv) + 3 * a.hidden * a.mlp + 2 * a.hidden
    return (layers * per_layer + 2 * a.vocab * a.hidden + a.hidden) / 1e9


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[4, 16, 22])
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--mlp", type=int, default=5632)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--tokens", type=int, default=64, help="tokens per batch")
    ap.add_argument("--batches", type=int, default=4, help="batches per evaluate")
    ap.add_argument("--tolerance", type=float, default=0.02)
    ap.add_argument("--fsdp", type=int, default=0, metavar="N", help="shard with FSDP2 over N torchrun ranks")
    ap.add_argument("--device", default="cpu", help="where the model runs (`mpt tune --device`): cpu or cuda")
    ap.add_argument("--mpt-args", nargs=argparse.REMAINDER, default=[], help="more `mpt tune` options (last)")
    args = ap.parse_args()
    if args.fsdp and args.device != "cpu":
        ap.error("--fsdp runs on CPU ranks (gloo): leave --device out")
    if args.fsdp and args.batches % args.fsdp:
        ap.error(f"--batches {args.batches} must split evenly over --fsdp {args.fsdp} ranks")
    print(f"# scale: {machine_line()}" + (f", FSDP2 over {args.fsdp} gloo ranks" if args.fsdp else "") + "\n")
    rows, phase_rows, ok = [], [], True
    with tempfile.TemporaryDirectory() as tmp:
        for layers in args.layers:
            r = one_depth(layers, args, Path(tmp))
            good_own, good_rss = r["own_share"] <= OWN_TARGET, r["rss"] <= RSS_TARGET * r["ref_rss"]
            ok &= good_own and good_rss and r["rc"] == 0
            rows.append([layers, f"{params(layers, args):.2f}", r["rc"], f"{r['wall']:.1f}", f"{r['evaluate']:.1f}",
                         f"{r['build']:.1f}", f"{r['own']:.1f}", f"{100 * r['own_share']:.1f}%",
                         pass_fail(good_own), f"{r['rss']:.2f}", f"{r['ref_rss']:.2f}",
                         f"{r['rss'] / r['ref_rss']:.2f}x", pass_fail(good_rss), r["evals"], r["candidates"],
                         "-" if r["share"] is None else f"{100 * r['share']:.1f}%"])
            for name, secs in sorted(r["seconds"].items(), key=lambda kv: -kv[1]):
                peak = r["peaks"].get(name)
                phase_rows.append([layers, name, f"{secs:.1f}", f"{100 * secs / r['wall']:.1f}%",
                                   "-" if peak is None else f"{peak:.2f}"])
            print(f"layers {layers}: done in {r['wall']:.0f} s", file=sys.stderr)
    print(table(["layers", "params (B)", "exit", "tune s", "in evaluate s", "in build s", "mpt own s", "own share",
                 f"<= {OWN_TARGET:.0%}", "peak RSS GiB", "FP32 eval RSS GiB", "ratio", f"<= {RSS_TARGET}x",
                 "evaluations", "candidates", "bf16 FLOP share"], rows))
    print("\nmpt's own time by phase (exclusive; the rest is process start, imports, the search itself):\n")
    print(table(["layers", "phase", "seconds", "of the tune", "peak RSS rose to (GiB)"], phase_rows))
    print(f"\n**{'all targets met' if ok else 'some targets FAIL'}**")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Tuned-model checks: checkpoint size, loaded-model latency, and the tuner's own overhead.

    .venv/bin/python benchmarks/tuned_speed.py [--rounds 7] [--block 0.25] [--quick]

(a) Checkpoint size. An all-bf16 plan (Plan(dtype="bf16", preset="torch-cpu"),
    no fallbacks) saved with tuner.report.checkpoint.save_checkpoint: file bytes vs
    the FP32 state dict's bytes (fp32_bytes). Models: the TransformerEncoder of
    engine_overhead.py, a small VGG-style CNN (benchmarks/_common.py), and
    examples/digits_cnn.py when present. Target: <= 52%.

(b) Loaded-model latency. The output folder (plan.yaml via Plan.save,
    model.safetensors via save_checkpoint) is loaded into a freshly built FP32
    model with tuner.report.checkpoint.load (engine "auto") and timed against
    `with torch.autocast("cpu", torch.bfloat16): fp32_model(x)`, interleaved
    (see engine_overhead.py; median of R rounds). Also shown: the FP32 model,
    and the FP32 model with the plan attached (tuner.attach, no pre-cast
    weights) to separate the effect of storing weights in bf16.
    Target: loaded model no slower than torch.autocast (ratio <= 1.00; the
    round-to-round noise is shown as IQR/median, so a ratio above 1.00 by
    less than that is marked "within noise").

(c) Tuner overhead. tuner.tune on PlantedTask(64, 2) and PlantedTask(256, 4),
    whose evaluate loops over ~410 held-out samples in batches of 32 as a
    DataLoader loop does: the tuner's own time, (result.seconds -
    result.eval_seconds - result.user_seconds) / result.seconds, median of 5
    runs after one warm-up tune. Target: < 20%. For context: the same tasks
    with an evaluate that is a single batch (as cheap as one ranking forward,
    so the fixed cost of ranking dominates), and the bundled examples.
"""
from __future__ import annotations

import argparse
import copy
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (ROOT, cnn_inputs, interleaved, machine_line, noise_note, pass_fail,  # noqa: E402
                     set_budget, small_cnn, spread, table, transformer_encoder, transformer_inputs)

import torch  # noqa: E402
from torch import nn  # noqa: E402

import tuner  # noqa: E402
from tuner.core.output_files import CHECKPOINT_NAME, PLAN_NAME  # noqa: E402
from tuner.report.checkpoint import CheckpointInfo, load, save_checkpoint  # noqa: E402
from tuner.policy.plan import Plan  # noqa: E402
from tuner.testing import PlantedTask  # noqa: E402
from tuner.options.tune import TuneOptions  # noqa: E402
from tuner.search.session import tune  # noqa: E402

SIZE_TARGET = 0.52
OVERHEAD_TARGET = 0.20
PLAN = Plan(dtype="bf16", preset="torch-cpu")


def example_module(name: str):
    """examples/NAME.py imported and checked to build; None (and why, printed) when it cannot be."""
    path = ROOT / "examples" / f"{name}.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location(f"mpt_bench_{name}", path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    try:
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
        mod.build_model()
    except Exception as exc:  # noqa: BLE001 - missing weights or sklearn: skip, say why
        print(f"(examples/{name}.py skipped: {exc})")
        return None
    return mod


def write_out_dir(model: nn.Module, inputs: tuple, out: Path) -> CheckpointInfo:
    out.mkdir(parents=True, exist_ok=True)
    PLAN.save(out / PLAN_NAME, header="benchmarks/tuned_speed.py: all-bf16 plan")
    return save_checkpoint(model, PLAN, inputs, out / CHECKPOINT_NAME)


def models() -> list[tuple[str, callable, dict[str, tuple]]]:
    """(name, build fn, {input label: inputs})."""
    found = [("TransformerEncoder", lambda: transformer_encoder(),
              {"batch 1": transformer_inputs(1), "batch 64": transformer_inputs(64)}),
             ("small CNN (VGG-style, 3x32x32)", lambda: small_cnn(), {"batch 8": cnn_inputs(8)})]
    digits = example_module("digits_cnn")
    if digits is not None:
        x = digits.example_inputs()
        _, _, x_test, _ = digits.load_split()
        found.append(("examples/digits_cnn.py", digits.build_model,
                      {f"batch {len(x[0])} (example_inputs)": x, "batch 256 (eval batch)": (x_test[:256].clone(),)}))
    return found


def part_a_b(rounds: int, block: float, tmp: Path) -> tuple[list, list]:
    size_rows, lat_rows, size_checks, lat_checks = [], [], [], []
    for name, build, inputs in models():
        model = build().eval()
        first_inputs = next(iter(inputs.values()))
        out = tmp / name.replace("/", "_").replace(" ", "_")
        info = write_out_dir(model, first_inputs, out)
        share = info.bytes / info.fp32_bytes
        n_params = sum(1 for _ in model.named_parameters())
        size_rows.append([name, f"{info.fp32_bytes / 1e6:.3f}", f"{info.bytes / 1e6:.3f}", f"{share:.1%}",
                          f"{info.lowered}/{n_params}", pass_fail(share <= SIZE_TARGET)])
        size_checks.append((name, share))

        loaded = load(build().eval(), out)
        attached = tuner.attach(copy.deepcopy(model), PLAN)
        with torch.no_grad():
            for label, x in inputs.items():
                def ref(x=x) -> object:
                    with torch.autocast("cpu", torch.bfloat16):
                        return model(*x)

                cfg = {"torch.autocast (FP32 weights)": ref,
                       "mpt loaded checkpoint": lambda x=x: loaded(*x),
                       "FP32 model + tuner.attach(plan)": lambda x=x: attached(*x),
                       "fp32": lambda x=x: model(*x)}
                same = torch.equal(cfg["mpt loaded checkpoint"]().float(), ref().float())
                res = interleaved(cfg, rounds=rounds, block_seconds=block)
                iters = interleaved.last_iters  # type: ignore[attr-defined]
                per_round = interleaved.last_rounds  # type: ignore[attr-defined]
                base = res["torch.autocast (FP32 weights)"]
                for cname, secs in res.items():
                    lat_rows.append([name, label, cname, f"{secs * 1e3:.3f}", f"{secs / base:.3f}x",
                                     f"{spread(per_round[cname]):.0%}",
                                     ("bitwise" if same else "differs") if cname == "mpt loaded checkpoint" else "",
                                     f"{len(per_round[cname])}x{iters[cname]}"])
                lat_checks.append((f"{name}, {label}", res["mpt loaded checkpoint"] / base,
                                   spread(per_round["mpt loaded checkpoint"])))
    print("\n### (a) Checkpoint size, all-bf16 plan (target <= 52% of FP32)\n")
    print(table(["model", "FP32 MB", "checkpoint MB", "share", "params stored bf16", "result"], size_rows))
    print("\n### (b) Loaded model vs torch.autocast on the FP32 model (median ms per forward, no_grad)\n")
    print(table(["model", "input", "config", "ms/forward", "vs torch.autocast", "IQR/median",
                 "output vs autocast", "rounds x iters"], lat_rows))
    return size_checks, lat_checks


def _tune_once(build, evaluate, example_inputs) -> tuple[float, list]:
    stamps: list[tuple[float, str]] = []
    t0 = time.monotonic()
    result = tune(build, evaluate, example_inputs, TuneOptions(dtype="bf16", tolerance=0.01),
                  on_event=lambda e: stamps.append((time.monotonic(), e.kind)))
    # Each phase's time ends at its event: "baseline" (build + baseline evaluate), "candidates" (a plain
    # and a recorded forward), "rank" (the ranking passes), "trial" (each evaluation), "done".
    rank, prev = 0.0, t0
    for t, kind in stamps:
        rank += (t - prev) if kind == "rank" else 0.0
        prev = t
    own = result.seconds - result.eval_seconds - result.user_seconds
    n_cand = max(1, len(result.candidates))
    row = [len(result.candidates), result.evals, f"{result.seconds:.3f}", f"{result.eval_seconds:.3f}",
           f"{result.user_seconds:.3f}", f"{rank:.3f}", f"{result.eval_seconds / result.evals * 1e3:.2f}",
           f"{own * 1e3 / n_cand:.2f}", f"{own / result.seconds:.1%}"]
    return own / result.seconds, row


def _tune_row(label: str, build, evaluate, example_inputs, repeats: int) -> tuple[list, float]:
    """The run with the median overhead of `repeats` runs (one-off pauses make single runs noisy)."""
    runs = sorted((_tune_once(build, evaluate, example_inputs) for _ in range(repeats)), key=lambda r: r[0])
    overhead, row = runs[len(runs) // 2]
    return [label] + row, overhead


def part_c(tasks: list[tuple[int, int]], repeats: int) -> list:
    warm = PlantedTask(16, 1)  # first-use costs of autograd and the bf16 kernels, paid once per process
    tune(warm.build, warm.evaluate, warm.example_inputs, TuneOptions(dtype="bf16"))
    rows, checks = [], []
    for n, k in tasks:
        task = PlantedTask(n, k, batch=32)
        row, overhead = _tune_row(f"PlantedTask({n}, {k}), evaluate in batches of 32", task.build,
                                  task.evaluate, task.example_inputs, repeats)
        rows.append(row + [pass_fail(overhead < OVERHEAD_TARGET)])
        checks.append((n, k, overhead))
    for n, k in tasks:  # context: an evaluate as cheap as one ranking forward
        task = PlantedTask(n, k)
        row, _ = _tune_row(f"PlantedTask({n}, {k}), evaluate in one batch", task.build, task.evaluate,
                           task.example_inputs, repeats)
        rows.append(row + ["(context)"])
    for name in ("digits_cnn", "digits_sensor", "digits_transformer"):
        ex = example_module(name)
        if ex is None:
            continue
        row, _ = _tune_row(f"examples/{name}.py", ex.build_model, ex.evaluate, ex.example_inputs, repeats)
        rows.append(row + ["(context)"])
    print("\n### (c) Tuner overhead: tuner's own seconds / total seconds (target < 20%)\n")
    print(f"Median of {repeats} runs each. Own = total - evaluate - user code (build_model, example_inputs).\n")
    print(table(["task", "candidates", "evals", "total s", "evaluate s", "user code s", "ranking s",
                 "ms per evaluate", "own ms per candidate", "own share", "result"], rows))
    return checks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--block", type=float, default=0.25, help="seconds per timed block (default 0.25)")
    ap.add_argument("--quick", action="store_true", help="5 rounds of 0.1 s blocks (smoke run)")
    args = ap.parse_args()
    set_budget(170)  # extra rounds for noisy timings stop after this many seconds
    if args.quick:
        args.rounds, args.block = 5, 0.1
    print("## tuned_speed: checkpoint size, loaded-model latency, tuner overhead")
    print(machine_line())
    with tempfile.TemporaryDirectory(prefix="mpt-bench-") as tmp:
        size_checks, lat_checks = part_a_b(args.rounds, args.block, Path(tmp))
    over_checks = part_c([(64, 2), (256, 4)], 3 if args.quick else 5)
    rows = [[f"(a) {name}: checkpoint <= 52% of FP32", f"{share:.1%}", pass_fail(share <= SIZE_TARGET)]
            for name, share in size_checks]
    rows += [[f"(b) {name}: loaded <= torch.autocast", f"{ratio:.3f}x (IQR/median {sp:.0%})",
              pass_fail(ratio <= 1.0) + ("" if ratio <= 1.0 or ratio - 1.0 > sp else " (within noise)")]
             for name, ratio, sp in lat_checks]
    rows += [[f"(c) tune PlantedTask({n}, {k}), batched evaluate: own time < 20%", f"{o:.1%}",
              pass_fail(o < OVERHEAD_TARGET)] for n, k, o in over_checks]
    print("\n### Targets\n")
    print(table(["target", "measured", "result"], rows))
    print(noise_note())


if __name__ == "__main__":
    main()

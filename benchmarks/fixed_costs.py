"""mpt's fixed costs against a short evaluation: a GPT-2 774M tuned zero-code, timed by phase.

On a GPU a large model's evaluation takes about a second, so what mpt does once per tune (writing the
checkpoint, measuring the report, moving tensors to the host) is what the user waits for (issue 44: a GPT-2
774M tuned on cuda in 23.6 s wall where its two evaluations took 1.1 s). This script saves a GPT-2 774M
(`GPT2Config(n_embd=1280, n_layer=36, n_head=20)`, seeded random init, `save_pretrained`) and a small
calibration file (2 x 64 tokens, so an evaluation is short on a CPU too) to a temp folder, runs
`mpt tune hf:DIR --data ... --metric kl --dtype bf16` in a fresh process with mpt's phases timed from inside
(exclusive time in the functions `PHASES` names; the search's phases from report.json's `seconds.phases`),
and prints a table by phase.

Target: mpt's own time besides importing, loading the model once and writing the checkpoint once is at most
3 s plus 10% of the evaluations' time. Own time is the tune process's wall time less the imports (mpt,
torch, transformers and its GPT-2 code), the first model load (its pages read in), the time inside evaluate
and the first checkpoint write.

    python benchmarks/fixed_costs.py                     # GPT-2 774M on the CPU (a few minutes)
    python benchmarks/fixed_costs.py --layers 2          # the same width, 2 layers: a quick smoke run
    python benchmarks/fixed_costs.py --device cuda       # on a GPU
    python benchmarks/fixed_costs.py --before /tmp/old   # another checkout's tuner/ and cli/ first: before/after
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

OWN_FIXED, OWN_SHARE = 3.0, 0.10  # the target: own time <= 3 s + 10% of the evaluations' time

# (phase, module, attribute path): timed exclusively in the child (a nested phase's time is its own only)
PHASES = [
    ("model load", "tuner.core.hf", "build_hf_model"),
    ("checkpoint write", "tuner.core.safetensors_write", "write_safetensors"),
    ("checkpoint check", "tuner.report.checkpoint", "save_checkpoint"),
    ("report: latency timing", "tuner.report.latency", "compare_latency"),
    ("report: verifying forward", "tuner.measure.deployed", "verify"),
    ("report: op lists", "tuner.report.oplists", "type_level"),
    ("report: measuring, rest", "tuner.report.measuring", "measure_report"),
    ("report: other files", "tuner.report.writer", "write_outputs"),
]
FIRST_ONLY = {"model load", "checkpoint write"}  # the first call is not mpt's own time; a second one is


def child(argv: list[str], timings: Path) -> int:
    """Run `mpt` in this process with PHASES timed; the timings go to `timings` as JSON."""
    start = time.monotonic()
    import functools
    import importlib

    import torch  # noqa: F401 - the imports are a phase of their own
    import transformers

    import tuner
    from mpt_cli.main import main

    spec = next((a for a in argv if a.startswith("hf:")), None)
    if spec is not None:  # transformers imports a model's code at first use: the class, here, is an import too
        for name in json.loads((Path(spec[3:]) / "config.json").read_text()).get("architectures") or []:
            getattr(transformers, name, None)

    imported = time.monotonic() - start
    spent: dict[str, float] = {}
    first: dict[str, float] = {}
    calls: dict[str, int] = {}
    stack: list[list[float]] = []

    def timed(name: str, fn):  # type: ignore[no-untyped-def]
        @functools.wraps(fn)
        def wrapper(*a, **k):  # type: ignore[no-untyped-def]
            stack.append([time.monotonic(), 0.0])
            try:
                found = fn(*a, **k)
                if name == "model load" and name not in first:
                    _read_in(found)
                return found
            finally:
                begun, nested = stack.pop()
                took = time.monotonic() - begun
                spent[name] = spent.get(name, 0.0) + took - nested
                calls[name] = calls.get(name, 0) + 1
                first.setdefault(name, took - nested)
                if stack:
                    stack[-1][1] += took
        return wrapper

    for name, module, attr in PHASES:
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        fn = getattr(mod, attr, None)
        if fn is None:
            continue
        wrapped = timed(name, fn)
        for other in list(sys.modules.values()):  # also where it was imported by name
            if other is not None and getattr(other, "__name__", "").startswith(("tuner", "mpt_cli")) \
                    and getattr(other, attr, None) is fn:
                setattr(other, attr, wrapped)
    profile = os.environ.get("MPT_FIXED_COSTS_PROFILE")
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    try:
        main(argv, standalone_mode=False)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(profile)
    timings.write_text(json.dumps({"wall": time.monotonic() - start, "imports": imported, "spent": spent,
                                   "first": first, "calls": calls, "tuner": tuner.__file__}))
    return code


def _read_in(model) -> None:  # type: ignore[no-untyped-def]
    """Touch every page of the model's tensors: a model loaded from safetensors maps the file and reads it at
    first use, which would otherwise count as whatever phase touches the weights first."""
    import torch

    module = getattr(model, "model", model)  # (mpt's wrapper of a sentence encoder holds the model)
    if isinstance(module, torch.nn.Module):
        with torch.no_grad():
            for t in module.state_dict().values():
                if t.numel() and t.device.type == "cpu":
                    step = max(1, 4096 // t.element_size())
                    t.reshape(-1)[::step].sum()


def make_model(folder: Path, layers: int, batch: int, tokens: int) -> None:
    """A GPT-2 774M-wide LM (seeded random init) saved with save_pretrained, and its calibration inputs."""
    import torch
    from safetensors.torch import save_file
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.manual_seed(0)
    config = GPT2Config(n_embd=1280, n_layer=layers, n_head=20)
    GPT2LMHeadModel(config).save_pretrained(folder)
    ids = torch.randint(0, config.vocab_size, (batch, tokens), generator=torch.Generator().manual_seed(1))
    save_file({"input_ids": ids}, str(folder / "calibration.safetensors"))


def shim(code: Path, work: Path) -> Path:
    """A folder to put first on PYTHONPATH so that `tuner` and `mpt_cli` are `code`'s tuner/ and cli/."""
    folder = work / "code"
    folder.mkdir()
    (folder / "tuner").symlink_to(code.resolve() / "tuner")
    (folder / "mpt_cli").symlink_to(code.resolve() / "cli")
    return folder


def run_tune(args: argparse.Namespace, model: Path, work: Path) -> dict:
    out, timings = work / "out", work / "timings.json"
    path = [str(shim(args.code, work))] if args.code else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(ROOT)])}
    if args.profile:
        env["MPT_FIXED_COSTS_PROFILE"] = str(args.profile.resolve())
    cmd = [sys.executable, __file__, "--child", str(timings), "tune", f"hf:{model}", "--data",
           str(model / "calibration.safetensors"), "--metric", args.metric, "--dtype", args.dtype, "--device",
           args.device, "--out", str(out), *args.mpt_args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not timings.exists():
        raise SystemExit(f"the tune failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    found = json.loads(timings.read_text())
    found["report"] = json.loads((out / "report.json").read_text())
    found["summary"] = proc.stdout.strip().splitlines()[-2:]
    return found


def rows_of(r: dict) -> tuple[dict[str, tuple[float, str]], float, float]:
    """phase -> (seconds, how it counts), mpt's own time and the evaluations' time."""
    seconds = r["report"]["seconds"]
    evals = float(seconds["evaluations"])
    spent, first, calls = r["spent"], r["first"], r["calls"]
    own = r["wall"] - r["imports"] - evals - sum(first.get(n, 0.0) for n in FIRST_ONLY)
    rows: dict[str, tuple[float, str]] = {"process wall": (r["wall"], ""),
                                          "imports (mpt, torch, transformers, GPT-2 code)": (r["imports"], "excluded"),
                                          "evaluations": (evals, "excluded")}
    for name in FIRST_ONLY:
        rows[f"{name} (first)"] = (first.get(name, 0.0), "excluded")
        if calls.get(name, 0) > 1:
            rows[f"{name} (again: {calls[name] - 1})"] = (spent[name] - first[name], "own")
    rows |= {name: (spent.get(name, 0.0), "own") for name, *_ in PHASES if name not in FIRST_ONLY}
    rows["checkpoint write and check, together"] = (first.get("checkpoint write", 0.0)
                                                    + spent.get("checkpoint check", 0.0), "")
    report_total = sum(spent.get(name, 0.0) for name, *_ in PHASES if name.startswith(("report", "checkpoint check")))
    rows["report phase less the first write (the sum of its rows)"] = (report_total, "own")
    search = {p: v["own"] for p, v in seconds["phases"].items() if p != "report"}
    rows |= {f"search: {p}": (v, "own") for p, v in search.items()}
    again = sum(spent[n] - first[n] for n in FIRST_ONLY if n in spent)
    rows["the rest (CLI, folder, journal, fingerprint, process end)"] = (
        own - report_total - sum(search.values()) - again, "own")
    rows["**mpt's own time**"] = (own, "")
    return rows, own, evals


def one_run(args: argparse.Namespace, code: Path | None, model: Path, work: Path) -> dict:
    args = argparse.Namespace(**{**vars(args), "code": code})
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        return run_tune(args, model, Path(tmp))


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        return child(sys.argv[3:], Path(sys.argv[2]))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _common import machine_line, pass_fail, table, work_folder

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="where the model runs (`mpt tune --device`): cpu or cuda")
    ap.add_argument("--layers", type=int, default=36, help="GPT-2 blocks (36: GPT-2 774M; 2: a quick smoke run)")
    ap.add_argument("--batch", type=int, default=2, help="calibration sequences")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per sequence")
    ap.add_argument("--metric", default="kl")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--code", type=Path, default=None,
                    help="a checkout whose tuner/ and cli/ to run instead of this one's")
    ap.add_argument("--before", type=Path, default=None,
                    help="also run this checkout's tuner/ and cli/ first (e.g. a worktree of main): a before/after "
                         "table")
    ap.add_argument("--profile", type=Path, default=None, help="also write the tune's cProfile stats here")
    ap.add_argument("--keep", type=Path, default=None, help="keep the model folder and outputs here")
    ap.add_argument("--mpt-args", nargs=argparse.REMAINDER, default=[], help="more `mpt tune` options (last)")
    args = ap.parse_args()
    print(f"# fixed costs: {machine_line()}, device {args.device}\n")
    runs: dict[str, dict] = {}
    with work_folder(args.keep, "mpt-fixed-costs-") as work:
        model = work / f"gpt2-{args.layers}"
        t0 = time.monotonic()
        if not (model / "config.json").exists():
            make_model(model, args.layers, args.batch, args.tokens)
        print(f"GPT-2 ({args.layers} layers, n_embd 1280) saved in {time.monotonic() - t0:.1f} s", file=sys.stderr)
        if args.before is not None:
            runs["before"] = one_run(args, args.before, model, work)
        runs["after" if args.before is not None else "seconds"] = one_run(args, args.code, model, work)
    tables = {name: rows_of(r) for name, r in runs.items()}
    for name, r in runs.items():
        code = args.before if name == "before" else args.code or ROOT
        print(f"{name}: {code} (tuner from {Path(r['tuner']).parent}); {r['report']['evaluations']} evaluations, "
              f"{100 * r['report']['low_precision_flop_share']:.1f}% of matmul/conv FLOPs low; "
              f"checkpoint {r['report']['checkpoint']['bytes'] / 2**30:.2f} GiB")
    phases = list(dict.fromkeys(p for rows, _, _ in tables.values() for p in rows))
    print()
    print(table(["phase", *tables, "counts as"],
                [[p, *(f"{rows[p][0]:.2f}" if p in rows else "-" for rows, _, _ in tables.values()),
                  next(rows[p][1] for rows, _, _ in tables.values() if p in rows)] for p in phases]))
    print("\n**Targets**\n")
    verdicts = []
    for name, (_, own, evals) in tables.items():
        limit = OWN_FIXED + OWN_SHARE * evals
        verdicts.append([f"{name}: mpt's own time <= 3 s + 10% of the evaluations", f"{own:.2f} s", f"{limit:.2f} s",
                         pass_fail(own <= limit)])
    print(table(["target", "measured", "limit", "result"], verdicts))
    _, own, evals = list(tables.values())[-1]
    return 0 if own <= OWN_FIXED + OWN_SHARE * evals else 1


if __name__ == "__main__":
    sys.exit(main())

"""Tuned plans under torch.compile and torch.export, on the model zoo (benchmarks/zoo/).

    .venv/bin/python benchmarks/compiled.py --work /tmp/zoowork       # reuse zoo.py --work outputs
    .venv/bin/python benchmarks/compiled.py --only resnet18 --size tiny

For each zoo model, `mpt tune` (or the tune output `benchmarks/zoo.py --work DIR` left in DIR/NAME),
then, in a fresh subprocess per model:

- eager: `tuner.load(build_model(), out)` (the native path: torch.autocast + FP32 module regions,
  weights stored in their compute dtype) against a **hand-made conversion of the same plan** (the
  same checkpoint, islands written as plain `nn.Module` wrappers around the submodules, the model
  called under `torch.autocast`; no mpt code at run time) and against the FP32 model under plain
  `torch.autocast`; interleaved rounds, median ms per forward on example_inputs().
- compiled (inductor): `torch.compile(loaded)` against `torch.compile` of the FP32 model under
  plain torch.autocast: time to the first call, graphs compiled over 6 calls with the same
  shapes (1 = no recompile), interleaved ms per call, and the output error against FP32 of
  compiled vs eager tuned.
- export: `torch.export.export(loaded, ...)`, decomposed: convolutions/matmuls in bf16 and in FP32
  (the islands), and the exported program's output against eager (max abs difference).

Prints one markdown table (and writes it to --out).
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import child_pythonpath, machine_line, table  # noqa: E402
from zoo import BY_NAME, ZOO, ZOO_DIR, _call, _import_model_file, missing_modules  # noqa: E402

MATMULS = ("convolution", "addmm", "mm", "bmm", "linear", "matmul", "baddbmm", "_scaled_dot_product")


# ----- a hand-made conversion: what a user would write with torch alone ---------------------------------------------
def hand_made(model, plan, checkpoint: Path):
    """The plan by hand: checkpoint weights, each FP32 island swapped for a wrapper module, autocast around calls."""
    import torch
    from safetensors.torch import load_file
    from torch import nn

    tensors = load_file(str(checkpoint))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.data = tensors[name]

    def to_fp32(x):
        return x.float() if isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16 else \
            type(x)(to_fp32(i) for i in x) if isinstance(x, tuple) else x

    class FP32(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args, **kwargs):
            with torch.autocast("cpu", enabled=False):
                return self.inner(*to_fp32(args), **{k: to_fp32(v) for k, v in kwargs.items()})

    class BackToLow(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args, **kwargs):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return to_fp32(self.inner(*args, **kwargs))

    islands = sorted({i.module for i in plan.fp32_instances} | {p for p, _ in plan.modules}, key=len, reverse=True)
    subtrees = {p for p, _ in plan.modules}
    for path in islands:  # deepest first, so a parent wraps its already wrapped children
        inner = model.get_submodule(path) if path else model
        if path not in subtrees:
            for child_name, child in list(inner.named_children()):
                if not isinstance(child, FP32):
                    setattr(inner, child_name, BackToLow(child))
        if path:
            parent, _, leaf = path.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, leaf, FP32(inner))
    root_fp32 = "" in islands

    class Autocasted(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args, **kwargs):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=not root_fp32):
                return self.inner(*args, **kwargs)

    return Autocasted(model)


class Autocast:
    """The FP32 model under plain torch.autocast, as a callable torch.compile can take."""

    def __init__(self, model) -> None:
        import torch

        self.model = model
        self.torch = torch

    def __call__(self, *args, **kwargs):
        with self.torch.autocast("cpu", dtype=self.torch.bfloat16):
            return self.model(*args, **kwargs)


# ----- the child: one model ------------------------------------------------------------------------------------------
def runner(path: Path, out: Path, rounds: int, block: float) -> dict:
    import torch

    import tuner
    from _common import interleaved, set_budget, spread
    from tuner.measure.inspection import relative_error
    from tuner.core.inputs import ModelInputs

    mod = _import_model_file(path)
    inputs = ModelInputs.of(mod.example_inputs())
    fp32 = mod.build_model()
    loaded = tuner.load(mod.build_model(), out)
    hand = hand_made(mod.build_model(), tuner.Plan.load(out), out / "model.safetensors")
    auto = Autocast(fp32)
    ex = tuner.attached(loaded)
    res: dict = {"path": ex.path.value, "islands": len(ex.fp32_islands) + len(ex.fp32_subtrees)}
    with torch.no_grad():
        ref = _call(fp32, inputs.args if not inputs.kwargs else dict(inputs.kwargs))
        run = (lambda m: (lambda: inputs.call(m)))
        eager_out = run(loaded)()
        res["hand_diff"] = _max_diff(eager_out, run(hand)())
        res["eager_err"] = relative_error(eager_out, ref)
        set_budget(120.0)
        if rounds:
            med = interleaved({"loaded": run(loaded), "hand": run(hand), "autocast": run(auto)}, rounds=rounds,
                              block_seconds=block)
            res.update({f"eager_{k}_ms": v * 1e3 for k, v in med.items()})
    res.update(_exported(loaded, inputs, eager_out))  # before compiling: export after compile can trip on state
    with torch.no_grad():
        torch._dynamo.reset()
        res.update(_compiled(loaded, "tuned", inputs))
        res.update(_compiled(auto, "autocast", inputs))
        res["compiled_err"] = relative_error(res.pop("tuned_out"), ref)
        res.pop("autocast_out")
        if rounds:
            ct, ca = res.pop("tuned_fn"), res.pop("autocast_fn")
            med = interleaved({"tuned": ct, "autocast": ca}, rounds=rounds, block_seconds=block)
            res.update({f"compiled_{k}_ms": v * 1e3 for k, v in med.items()})
            per = interleaved.last_rounds  # type: ignore[attr-defined]
            res["compiled_spread"] = max(spread(v) for v in per.values())
        res.pop("tuned_fn", None), res.pop("autocast_fn", None)
    return res


def _compiled(model, name: str, inputs) -> dict:
    import torch
    from torch._dynamo.utils import counters

    compiled = torch.compile(model)
    before = counters["stats"]["unique_graphs"]
    t0 = time.perf_counter()
    out = inputs.call(compiled)
    first = time.perf_counter() - t0
    at_first = counters["stats"]["unique_graphs"] - before
    for _ in range(5):
        inputs.call(compiled)
    return {f"{name}_first_s": first, f"{name}_graphs": at_first,
            f"{name}_recompiles": counters["stats"]["unique_graphs"] - before - at_first,
            f"{name}_out": out, f"{name}_fn": lambda: inputs.call(compiled)}


def _exported(model, inputs, eager_out) -> dict:
    import torch

    try:
        ep = torch.export.export(model, inputs.args, dict(inputs.kwargs))
        with torch.no_grad():
            res: dict = {"export_diff": _max_diff(eager_out, ep.module()(*inputs.args, **inputs.kwargs))}
    except Exception as exc:  # noqa: BLE001 - reported in the table
        return {"export_error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    try:  # the decomposed graph shows each matmul's dtype (autocast applied)
        nodes = ep.run_decompositions().graph.nodes
    except Exception as exc:  # noqa: BLE001 - GPT-2's Conv1D view trips run_decompositions, FP32 model too
        res["decompose_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:60] if str(exc) else ''}"
        return res
    res["export_low"] = res["export_fp32"] = 0
    for node in nodes:
        val = node.meta.get("val")
        if node.op == "call_function" and any(k in str(node.target) for k in MATMULS) and hasattr(val, "dtype"):
            res["export_low"] += val.dtype == torch.bfloat16
            res["export_fp32"] += val.dtype == torch.float32
    return res


def _max_diff(a, b) -> float:
    from tuner.core.inputs import float_leaves

    la, lb = float_leaves(a), float_leaves(b)
    return max(((x.float() - y.float()).abs().max().item() for x, y in zip(la, lb)), default=0.0)


# ----- the parent ----------------------------------------------------------------------------------------------------
def _tuned(m, work: Path, env: dict) -> Path:
    out = work / m.name
    if not (out / "plan.yaml").is_file():
        subprocess.run([sys.executable, "-m", "mpt_cli", "tune", str(ZOO_DIR / m.file), *m.flags(), "--out", str(out),
                        "--overwrite", "--quiet", "--no-latency"], env=env, check=True, cwd=HERE.parent)
    return out


def _row(name: str, r: dict) -> list[str]:
    if "error" in r:
        return [name, r["error"]] + [""] * 8

    def ms(k: str) -> str:
        return f"{r[k]:.2f}" if k in r else "-"

    eager = f"{ms('eager_loaded_ms')} / {ms('eager_hand_ms')} / {ms('eager_autocast_ms')}"
    vs_hand = f"{r['eager_loaded_ms'] / r['eager_hand_ms']:.3f}" if "eager_hand_ms" in r else "-"
    comp = f"{ms('compiled_tuned_ms')} / {ms('compiled_autocast_ms')}"
    vs_auto = f"{r['compiled_tuned_ms'] / r['compiled_autocast_ms']:.2f}" if "compiled_autocast_ms" in r else "-"
    graphs = f"{r['tuned_graphs']}+{r['tuned_recompiles']} / {r['autocast_graphs']}+{r['autocast_recompiles']}"
    err = f"{r['compiled_err']:.2e} / {r['eager_err']:.2e}"
    export = r.get("export_error") or (f"{r['export_low']} bf16, {r['export_fp32']} fp32" if "export_low" in r else
                                       "decomposition fails (FP32 model too)") + f"; Δ {r['export_diff']:.0e}"
    return [name, f"{r['path']} ({r['islands']} islands)", eager, vs_hand, comp, vs_auto,
            f"{r['tuned_first_s']:.0f} / {r['autocast_first_s']:.0f}", graphs, err, export]


HEADERS = ["model", "loaded path", "eager ms: loaded / hand / autocast", "loaded/hand", "compiled ms: tuned / autocast",
           "tuned/autocast", "1st call s", "graphs + recompiles", "rel. error compiled / eager", "export: matmuls, Δ eager"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="model names, comma-separated (default: all)")
    ap.add_argument("--work", type=Path, help="tune outputs: reused when DIR/NAME/plan.yaml exists")
    ap.add_argument("--size", choices=("full", "tiny"), default="full")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--block", type=float, default=0.2)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--runner", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.runner:
        print(json.dumps(runner(Path(args.runner[0]), Path(args.runner[1]), args.rounds, args.block), default=str))
        return 0
    env = dict(os.environ, MPT_ZOO_SIZE=args.size, PYTHONPATH=child_pythonpath())
    work = args.work or Path(tempfile.mkdtemp(prefix="mpt-compiled-"))
    names = [n for n in args.only.split(",") if n] or [m.name for m in ZOO]
    rows = []
    for name in names:
        m = BY_NAME[name]
        if missing_modules(m):
            rows.append([name, f"skipped: needs {', '.join(missing_modules(m))}"] + [""] * 8)
            continue
        out = _tuned(m, work, env)
        proc = subprocess.run([sys.executable, __file__, "--runner", str(ZOO_DIR / m.file), str(out), "--rounds",
                               str(args.rounds), "--block", str(args.block)], env=env, capture_output=True, text=True)
        lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
        r = json.loads(lines[-1]) if lines else {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"}
        print(f"{name}: {r}", file=sys.stderr)
        rows.append(_row(name, r))
    text = f"{machine_line()}\n\n{table(HEADERS, rows)}\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Is the reported lower-precision share what the loaded plan runs? The ATen-level check of the model zoo.

    .venv/bin/python benchmarks/aten_share.py --size tiny                    # every zoo model, bf16 and fp16
    .venv/bin/python benchmarks/aten_share.py --size tiny --only unet,spectral --dtypes bf16
    .venv/bin/python benchmarks/aten_share.py --device cuda --out aten.md   # on a GPU

For each zoo model (benchmarks/zoo.py's ZOO table: its file and tune flags, with --dtype replaced)
and each dtype, each step in its own subprocess (MPT_ZOO_SIZE, MPT_ZOO_DEVICE set as benchmarks/zoo.py
sets them):

1. `mpt tune MODEL.py --dtype D --tolerance T [...] --device DEVICE --out TMP --overwrite --quiet`.
2. A runner loads the plan, `tuner.load(build_model().to(DEVICE), out)`, and
   - evaluates it: the metric must equal report.json's `final_metric` (within the measured noise, at
     least 1e-6);
   - runs one forward of example_inputs() under a TorchDispatchMode and counts the matmul/conv FLOPs of
     every ATen matmul/conv/attention/RNN call (`tuner.measure.deployed.GEMMS`; FLOPs by
     `tuner.measure.flops.aten_flops`) by the dtype the call computes in (its output's): the ATen
     share is the bf16/fp16 FLOPs over all of them. It must equal report.json's
     `low_precision_flop_share` (to 1e-9).
3. `mpt check OUT --checkpoint` (the stored model.safetensors evaluated against the target): exit 0.

Prints one table (model, dtype, report share, ATen share, equal?, metric reproduced?, check exit,
PASS/FAIL) and writes it to --out (markdown; JSON when the name ends in .json). Exit 1 when a row fails.
A model whose optional modules are missing (transformers) is skipped.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from zoo import BY_NAME, ZOO_DIR, _import_model_file, _last_json, _tail, _to_device, missing_modules, run_child  # noqa: E402

DTYPES = ("bf16", "fp16")
SHARE_TOL = 1e-9


def runner_count(path: Path, out: Path, device: str) -> dict:
    """The loaded plan's metric, and its matmul/conv FLOPs on example_inputs() by the dtype of each ATen call."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    import tuner
    from tuner.measure.deployed import GEMMS
    from tuner.measure.flops import aten_flops

    mod = _import_model_file(path)
    loaded = tuner.load(mod.build_model().to(device), out)
    metric = float(mod.evaluate(loaded))
    by_dtype: dict[str, int] = {}
    by_op: dict[str, dict[str, int]] = {}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            result = func(*args, **kwargs)
            name = func.overloadpacket.__name__
            if name in GEMMS:
                flops = aten_flops(name, args, kwargs, result)
                first = next((t for t in torch.utils._pytree.tree_leaves(result) if isinstance(t, torch.Tensor)
                              and t.is_floating_point()), None)
                dtype = str(first.dtype).replace("torch.", "") if first is not None else "none"
                by_dtype[dtype] = by_dtype.get(dtype, 0) + flops
                by_op.setdefault(name, {})[dtype] = by_op.setdefault(name, {}).get(dtype, 0) + flops
            return result

    inputs = _to_device(mod.example_inputs(), device)
    with torch.no_grad(), torch.random.fork_rng(devices=[]), Count():
        torch.manual_seed(0)
        if isinstance(inputs, dict):
            loaded(**inputs)
        elif isinstance(inputs, tuple):
            loaded(*inputs)
        else:
            loaded(inputs)
    total = sum(by_dtype.values())
    low = by_dtype.get("bfloat16", 0) + by_dtype.get("float16", 0)
    return {"metric": metric, "flops": by_dtype, "by_op": by_op, "aten_share": low / total if total else 0.0}


def check_one(name: str, dtype: str, args, work: Path, env: dict) -> dict:
    m = BY_NAME[name]
    row: dict = {"model": name, "dtype": dtype}
    missing = missing_modules(m)
    if missing:
        row["skipped"] = f"needs {', '.join(missing)}"
        return row
    path = ZOO_DIR / m.file
    out = work / f"{name}-{dtype}"
    flags = m.flags()
    flags[flags.index("--dtype") + 1] = dtype
    tune = run_child([sys.executable, "-m", "mpt_cli", "tune", str(path), *flags, "--device", args.device,
                      "--out", str(out), "--overwrite", "--quiet"], env, args.child_timeout,
                     work / f"{name}-{dtype}.tune.log")
    row["tune_rc"] = tune.rc
    report_path = out / "report.json"
    if not report_path.is_file() or not (out / "plan.yaml").is_file():
        row["error"] = f"mpt tune exit {tune.rc}: {_tail(tune.output)}"
        return row
    report = json.loads(report_path.read_text())
    row.update(report_share=report.get("low_precision_flop_share"), tuned=report.get("final_metric"),
               noise=report.get("noise"), fp32_instances=len(report.get("fp32_instances") or []))
    c = run_child([sys.executable, str(Path(__file__).resolve()), "--runner", str(path), str(out),
                   "--device", args.device], env, args.child_timeout, work / f"{name}-{dtype}.count.log")
    counted = _last_json(c.output)
    if counted is None:
        row["error"] = f"runner exit {c.rc}: {_tail(c.output)}"
    else:
        row.update(aten_share=counted["aten_share"], loaded_metric=counted["metric"], aten_flops=counted["flops"],
                   aten_by_op=counted["by_op"])
    chk = run_child([sys.executable, "-m", "mpt_cli", "check", str(out), "--checkpoint"], env, args.child_timeout,
                    work / f"{name}-{dtype}.check.log")
    row["check_rc"] = chk.rc
    if chk.rc != 0:
        row["check_tail"] = _tail(chk.output)
    share_ok = (row.get("aten_share") is not None and row.get("report_share") is not None
                and abs(row["aten_share"] - row["report_share"]) <= SHARE_TOL)
    metric_ok = (row.get("loaded_metric") is not None and row.get("tuned") is not None
                 and abs(row["loaded_metric"] - row["tuned"]) <= max(float(row.get("noise") or 0.0), 1e-6))
    row.update(share_ok=share_ok, metric_ok=metric_ok, passed=share_ok and metric_ok and chk.rc == 0)
    return row


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.4f}%"


def table_row(r: dict) -> list[str]:
    if "skipped" in r:
        return [r["model"], r["dtype"], "-", "-", "-", "-", "-", f"skipped ({r['skipped']})"]
    if "error" in r and "aten_share" not in r:
        return [r["model"], r["dtype"], _pct(r.get("report_share")), "-", "-", "-", "-", f"FAIL: {r['error'][:80]}"]
    return [r["model"], r["dtype"], _pct(r["report_share"]), _pct(r["aten_share"]), "yes" if r["share_ok"] else "NO",
            "yes" if r["metric_ok"] else f"NO ({r['loaded_metric']:.6g} vs {r['tuned']:.6g})", str(r["check_rc"]),
            "PASS" if r["passed"] else "FAIL"]


HEADERS = ["model", "dtype", "report share", "ATen share", "equal?", "metric reproduced?", "check exit", "result"]
NEW = ("fused_transformer", "spectral", "unet")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", default=[], help="model name(s), comma-separated or repeated: "
                    + ", ".join(BY_NAME))
    ap.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated: bf16,fp16 (default both)")
    ap.add_argument("--size", choices=("full", "tiny"), default="tiny", help="MPT_ZOO_SIZE (default tiny)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--threads", type=int, help="OMP_NUM_THREADS for the children")
    ap.add_argument("--child-timeout", type=float, default=600.0)
    ap.add_argument("--work", type=Path, help="keep the tune outputs and logs here (default: a temp folder)")
    ap.add_argument("--out", type=Path, help="also write the table here (markdown; JSON when it ends in .json)")
    ap.add_argument("--runner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("paths", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.runner:
        print(json.dumps(runner_count(Path(args.paths[0]), Path(args.paths[1]), args.device)))
        return 0
    names = [n.strip() for part in args.only for n in part.split(",") if n.strip()] or \
        [*NEW, *(n for n in BY_NAME if n not in NEW)]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {', '.join(BY_NAME)}")
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    from _common import child_pythonpath, machine_line, table, work_folder

    env = dict(os.environ, MPT_ZOO_SIZE=args.size, MPT_ZOO_DEVICE=args.device, PYTHONPATH=child_pythonpath())
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)

    print(machine_line())
    print(f"zoo size {args.size}; device {args.device}; models {', '.join(names)}; dtypes {', '.join(dtypes)}\n",
          flush=True)
    t0 = time.perf_counter()
    rows = []
    with work_folder(args.work, "mpt-aten-share-") as work:
        for name in names:
            for dtype in dtypes:
                r = check_one(name, dtype, args, work, env)
                rows.append(r)
                print(f"[{name} {dtype}] " + " | ".join(table_row(r)[2:]), flush=True)
                if r.get("check_tail"):
                    print(f"    mpt check: {r['check_tail']}")
                if r.get("aten_by_op") and not r.get("share_ok"):
                    print(f"    ATen FLOPs by op and dtype: {r['aten_by_op']}")
    md = table(HEADERS, [table_row(r) for r in rows])
    print()
    print(md)
    failed = [r for r in rows if "skipped" not in r and not r.get("passed")]
    print(f"\n{len(rows) - len(failed)} of {len(rows)} rows pass (skipped rows count as passing); "
          f"{time.perf_counter() - t0:.0f} s")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        if args.out.suffix == ".json":
            args.out.write_text(json.dumps({"machine": machine_line(), "size": args.size, "device": args.device,
                                            "rows": rows}, indent=2, default=str) + "\n")
        else:
            args.out.write_text("\n".join(["# ATen-level share check", "", f"- {machine_line()}",
                                           f"- zoo size {args.size}, device {args.device}", "", md, ""]))
        print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

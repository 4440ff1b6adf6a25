"""Fault battery: bad inputs and faults against the real `mpt` CLI, one subprocess per case.

Not a test (the suite does not run it): a report. Each case gets a fresh temp
folder, writes the model files / configs / op lists it needs there, runs
`python -m mpt_cli ...` from the repository root (PYTHONUNBUFFERED=1) and records
the exit code, the wall time and the first line of stderr (of stdout when
stderr is empty). The Markdown table goes to stdout, followed by the cases
whose exit code differs from the one the case expects. Progress goes to
stderr. The script always exits 0.

    .venv/bin/python benchmarks/fault_battery.py > /tmp/fault_battery.md
    .venv/bin/python benchmarks/fault_battery.py --only journal: --timeout 60
    .venv/bin/python benchmarks/fault_battery.py --list

Every case is named `<class>: <what>`; `--only TEXT` runs the cases whose name holds TEXT (`--only hooks:` one
class; repeat it for more), `--list` prints the classes. The cases live in `fault_cases_*.py`, one module per
group of classes (CASE_MODULES below, in the table's order), on the harness in `fault_harness.py` (case type,
runner, table) and the model-file text in `fault_models.py`; case modules import only those two, so nothing
imports back. The whole battery (244 cases) takes about 13 minutes on 2 CPU cores.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fault_cases_composites
import fault_cases_deployed
import fault_cases_dtypes
import fault_cases_fused
import fault_cases_hooks
import fault_cases_islands
import fault_cases_model
import fault_cases_options
import fault_cases_outputs
import fault_cases_resume
import fault_cases_runtime
from fault_harness import _TUNED, USE_CACHE, Case, print_table, run_all

CASE_MODULES = (fault_cases_model, fault_cases_options, fault_cases_outputs, fault_cases_runtime, fault_cases_deployed,
                fault_cases_hooks, fault_cases_dtypes, fault_cases_fused, fault_cases_islands, fault_cases_composites,
                fault_cases_resume)


def case_class(case: Case) -> str:
    """The class a case belongs to: its name up to the first colon."""
    return case.name.split(":", 1)[0]


def cases() -> list[Case]:
    """Every case, in table order."""
    return [case for module in CASE_MODULES for case in module.cases()]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", metavar="TEXT", action="append", default=[],
                    help="run only the cases whose name contains TEXT (a class: `--only hooks:`); repeatable")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per case (default 120)")
    ap.add_argument("--no-cache", action="store_true",
                    help="tune afresh in every case that needs a tuned folder (default: copy the first one)")
    ap.add_argument("--list", action="store_true", help="print each class, its module and its number of cases")
    args = ap.parse_args(argv)
    USE_CACHE[0] = not args.no_cache
    if args.list:
        for module in CASE_MODULES:
            counts = Counter(case_class(c) for c in module.cases())
            print(f"{module.__name__}.py: " + ", ".join(f"{k} ({counts[k]})" for k in module.CLASSES))
        return 0

    only = [text.lower() for text in args.only]
    selected = [(n, c) for n, c in enumerate(cases(), 1) if not only or any(t in c.name.lower() for t in only)]
    rows = []
    t_all = time.monotonic()
    try:
        rows = run_all(selected, args.timeout)
    finally:
        for keep in _TUNED.values():
            shutil.rmtree(keep, ignore_errors=True)
    print_table(rows, time.monotonic() - t_all)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fault classes of a run under way: `signal` (SIGINT/SIGTERM at a phase, --time-budget), `noise` (a noisy
evaluate), `dist` (torchrun misconfiguration), `oom` (out of memory, retried or not) and `thread` (threads the model
file leaves running).
"""
from __future__ import annotations

import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable

from fault_harness import ANSI, Case, Ctx, Run, exists_note, journal_lines, took, tune, wait_for
from fault_models import BUILD_FRAGILE, DATA_FRAGILE, HOOK_NOISY, HOOK_SLOW_AFTER_PASS, OK, model_src, slow

CLASSES = ("signal", "noise", "dist", "oom", "thread")
T = "{T}"  # the case's temp folder, in argv
M = {"m.py": OK}  # the battery's MLP: the files of most cases

# counts evaluate's calls in a file beside the model; raises MemoryError on call %(when)s
OOM_EVAL = """\
@torch.no_grad()
def evaluate(model):
    p = os.path.join(HERE, "calls.txt")
    n = int(open(p).read()) + 1 if os.path.exists(p) else 1
    open(p, "w").write(str(n))
    if %(when)s:
        raise %(exc)s
    x = _data(64, 2)
    ref = build_model().double()(x.double())
    return float(1.0 - (model(x).double() - ref).norm() / ref.norm())
"""

THREAD_EVAL = """\
import threading
_T = []
@torch.no_grad()
def evaluate(model):
    if not _T:
        _T.append(threading.Thread(target=time.sleep, args=(600,)))
        _T[0].start()
    x = _data(64, 2)
    ref = build_model().double()(x.double())
    return float(1.0 - (model(x).double() - ref).norm() / ref.norm())
"""

THREAD_BUILD = """\
import threading
def build_model():
    threading.Thread(target=time.sleep, args=(600,)).start()
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- signals ------------------------------------------------------------------------------------------------------
def sigint_after_pass(ctx: Ctx, proc: subprocess.Popen) -> None:
    journal = ctx.p("out/journal.jsonl")

    def passed() -> bool:
        return any(r.get("kind") == "eval" and r.get("passed") and not str(r.get("key", "")).startswith("baseline")
                   for r in journal_lines(journal))

    if not wait_for(passed, 90, proc):
        ctx.notes.append("no passing trial seen before the run ended")
        return
    time.sleep(0.5)  # inside the next (30 s) evaluation
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    else:
        ctx.notes.append("run ended before the signal")


def sigint_note(ctx: Ctx, run: Run) -> str:
    plan = ctx.p("out/plan.yaml")
    if not plan.exists():
        return "plan.yaml absent"
    text = plan.read_text(encoding="utf-8", errors="replace")
    stopped = re.search(r"^\s*stopped:\s*(\S+)", text, re.M)
    n = len(re.findall(r"^\s*- \{?module", text, re.M))
    return f"plan.yaml present (stopped: {stopped.group(1) if stopped else '?'}; {n} FP32 instances)"


def in_baseline(sig: signal.Signals) -> Callable[[Ctx, subprocess.Popen], None]:
    """Action: send `sig` inside the first baseline evaluation (it sleeps 3 s), once evals.log appears."""

    def action(ctx: Ctx, proc: subprocess.Popen) -> None:
        if not wait_for(ctx.p("evals.log").exists, 60, proc):
            ctx.notes.append("evaluate never started")
            return
        time.sleep(0.5)
        if proc.poll() is None:
            proc.send_signal(sig)

    return action


def sigterm_note(ctx: Ctx, run: Run) -> str:
    calls = ctx.p("evals.log").read_text().split("\n") if ctx.p("evals.log").exists() else []
    lines = journal_lines(ctx.p("out/journal.jsonl"))
    evals = sum(1 for r in lines if r.get("kind") == "eval")
    journal = f"has {evals} evals" if lines else "absent"
    return f"{len([c for c in calls if c])} evaluate call(s); journal {journal}; " + exists_note(ctx, "out/plan.yaml")


def budget_note(budget: float, sleep: float) -> Callable[[Ctx, Run], str]:
    def note(ctx: Ctx, run: Run) -> str:
        log = ctx.p("evals.log")
        calls = [c for c in log.read_text().split("\n") if c] if log.exists() else []
        return (f"budget {budget:g} s, evaluate {sleep:g} s: {len(calls)} evaluate calls, wall {run.seconds:.1f} s "
                f"(budget + one evaluation = {budget + sleep:g} s; the budget starts after ~1.5 s of imports)")

    return note


def noise_note(ctx: Ctx, run: Run) -> str:
    text = ANSI.sub("", run.stdout + "\n" + run.stderr)
    for line in text.splitlines():
        if "noise" in line.lower() or "noisy" in line.lower():
            return "noise line: " + line.strip()
    plan = ctx.p("out/plan.yaml")
    if plan.exists():
        m = re.search(r"^\s*noise:\s*(\S+)", plan.read_text(), re.M)
        if m:
            return f"no noise line printed; plan.yaml metrics.noise = {m.group(1)}"
    return "no noise line printed"


def cases() -> list[Case]:
    return [*_signals(), *_resources()]


def _signals() -> list[Case]:
    """Signals, time budgets, noise."""
    C: list[Case] = []
    add = C.append
    add(Case("signal: SIGINT after a passing trial", tune(), 130,
             {"m.py": model_src(build=BUILD_FRAGILE, data=DATA_FRAGILE, hook=HOOK_SLOW_AFTER_PASS)},
             action=sigint_after_pass, note=sigint_note))
    add(Case("signal: SIGTERM during the baseline", tune(), 130, {"m.py": slow(3.0)},
             action=in_baseline(signal.SIGTERM), note=sigterm_note))
    add(Case("signal: --time-budget 3, evaluate sleeps 2 s", tune(f"{T}/m.py", "--time-budget", "3"), 3,
             {"m.py": slow(2.0, "fragile")}, note=budget_note(3, 2)))
    add(Case("signal: --time-budget 4, evaluate sleeps 1 s", tune(f"{T}/m.py", "--time-budget", "4"), 3,
             {"m.py": slow(1.0, "fragile")}, note=budget_note(4, 1)))
    add(Case("signal: SIGINT during the baseline", tune(), 130, {"m.py": slow(3.0)}, action=in_baseline(signal.SIGINT),
             note=sigterm_note))
    # --- noise -------------------------------------------------------------------------------------------------------
    add(Case("noise: evaluate with +-0.3% seeded noise", tune(f"{T}/m.py", "--tolerance", "0.02"), 0,
             {"m.py": model_src(hook=HOOK_NOISY)}, note=noise_note))
    return C


def _resources() -> list[Case]:
    """torchrun, memory, threads."""
    C: list[Case] = []
    add = C.append
    # --- torchrun misconfiguration -------------------------------------------------------------------------------
    add(Case("dist: WORLD_SIZE=2 without a launcher", tune(), 2, M,
             env={"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}, note=took))
    add(Case("dist: lone rank 1, nothing at MASTER_PORT", tune(), 2, M,
             env={"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
                  "MASTER_PORT": str(free_port()), "MPT_DIST_TIMEOUT": "20"}, note=took))
    add(Case("dist: lone rank 0, no rank 1 ever joins (join timeout 5 s, collectives 1800 s)", tune(), 2, M,
             env={"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                  "MASTER_PORT": str(free_port()), "MPT_DIST_TIMEOUT": "1800", "MPT_DIST_JOIN_TIMEOUT": "5"},
             note=took))

    # --- out of memory -------------------------------------------------------------------------------------------
    add(Case("oom: MemoryError in the first trial only (retried)", tune(), 0,
             {"m.py": model_src(build=BUILD_FRAGILE, data=DATA_FRAGILE,
                                evaluate=OOM_EVAL % {"when": "n == 3", "exc": "MemoryError()"})}))
    add(Case("oom: MemoryError in the baseline", tune(), 2,
             {"m.py": model_src(evaluate=OOM_EVAL % {"when": "True", "exc": "MemoryError()"})}))
    add(Case("oom: torch.OutOfMemoryError in every trial", tune(), 2,
             {"m.py": model_src(build=BUILD_FRAGILE, data=DATA_FRAGILE, evaluate=OOM_EVAL % {
                 "when": "n >= 3", "exc": "torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2 GiB')"})}))
    add(Case("oom: build_model raises MemoryError", tune(), 2,
             {"m.py": model_src(build="def build_model():\n    raise MemoryError()\n")}))
    add(Case("oom: CPU allocator error in forward (inspect)", ["inspect", f"{T}/m.py"], 2, {"m.py": model_src(
        inputs="def example_inputs():\n    return (_data(2, 1),)\n",
        tail="def _oom(self, x):\n    raise RuntimeError(\"[enforce fail at alloc_cpu.cpp:117] "
             "DefaultCPUAllocator: can't allocate memory: you tried to allocate 99999999999 bytes\")\n"
             "nn.Sequential.forward = _oom\n")}))

    # --- threads left running ------------------------------------------------------------------------------------
    add(Case("thread: evaluate leaves a non-daemon thread", tune(), 0,
             {"m.py": model_src(evaluate=THREAD_EVAL)}, note=took))
    add(Case("thread: build_model leaves a non-daemon thread", tune(), 0,
             {"m.py": model_src(build=THREAD_BUILD)}, note=took))

    return C

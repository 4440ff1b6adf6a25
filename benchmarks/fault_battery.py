"""Fault battery: bad inputs and faults against the real `mpt` CLI, one subprocess per case.

Not a test (the suite does not run it): a report. Each case gets a fresh temp
folder, writes the model files / configs / op lists it needs there, runs
`python -m mpt_cli ...` from the repository root (PYTHONUNBUFFERED=1) and records
the exit code, the wall time and the first line of stderr (of stdout when
stderr is empty). The Markdown table goes to stdout, followed by the cases
whose exit code differs from the one the case expects. Progress goes to
stderr. The script always exits 0.

    .venv/bin/python benchmarks/fault_battery.py > /tmp/fault_battery.md
    .venv/bin/python benchmarks/fault_battery.py --only journal --timeout 60

About 2-3 minutes on 2 CPU cores.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

# ----------------------------------------------------------------------------------------------------------------
# Model file building blocks. Every model is tiny and seeded; evaluate takes milliseconds unless a case makes it
# sleep. The metric is 1 - relative L2 error against a float64 run of the same weights (float64 is never cast).
# ----------------------------------------------------------------------------------------------------------------
HEAD = """\
import os, time, math, random
import torch
from torch import nn
HERE = os.path.dirname(os.path.abspath(__file__))
"""

BUILD = """\
def build_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
"""

DATA = """\
def _data(n, seed):
    return torch.randn(n, 8, generator=torch.Generator().manual_seed(seed))
"""

INPUTS = """\
def example_inputs():
    return (_data(2, 1),)
"""

# Called at the start of every evaluate; slow variants replace it.
HOOK = """\
def _before():
    pass
def _after(metric):
    return metric
"""

EVAL = """\
@torch.no_grad()
def evaluate(model):
    _before()
    x = _data(64, 2)
    ref = build_model().double()(x.double())
    y = model(x).double()
    return _after(float(1.0 - (y - ref).norm() / ref.norm()))
"""

# Two op instances bf16 breaks: inputs and hidden activations carry a DC offset of 4096 that the next layer's bias
# cancels (bf16's spacing near 4096 is 32, larger than the signal). The search needs about 6 evaluations on
# it: the baseline, all-low (fail), 2 trials until one passes, then more to drop what is not needed.
BUILD_FRAGILE = """\
def build_model():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    with torch.no_grad():
        m[0].bias.copy_(-4096.0 * m[0].weight.sum(1) + 4096.0)
        m[2].bias.copy_(-4096.0 * m[2].weight.sum(1))
    return m.eval()
"""

DATA_FRAGILE = """\
def _data(n, seed):
    g = torch.Generator().manual_seed(seed)
    return 4096.0 + 16.0 * torch.rand(n, 8, generator=g)
"""

# evaluate writes its call number to evals.log beside the model file, then sleeps.
HOOK_SLOW = """\
_N = [0]
def _before():
    _N[0] += 1
    with open(os.path.join(HERE, "evals.log"), "a") as fh:
        fh.write(f"{_N[0]} {os.getpid()}\\n")
    time.sleep(%(sleep)s)
def _after(metric):
    return metric
"""

# Fast until a search trial passes (call > 2, metric near the baseline), then every later call sleeps 30 s,
# so a signal sent after the first passing trial lands inside an evaluation.
HOOK_SLOW_AFTER_PASS = """\
_N = [0]
_PASSED = [False]
def _before():
    _N[0] += 1
    if _PASSED[0]:
        time.sleep(30)
    else:
        time.sleep(0.2)
def _after(metric):
    if _N[0] > 2 and metric > 0.99:
        _PASSED[0] = True
    return metric
"""

# Seeded random noise of +-0.3% on each call (different on each call, same sequence on each run).
HOOK_NOISY = """\
_RNG = random.Random(0)
def _before():
    pass
def _after(metric):
    return metric * (1.0 + _RNG.uniform(-0.003, 0.003))
"""


def model_src(*, head: str = HEAD, build: str = BUILD, data: str = DATA, inputs: str | None = INPUTS,
              hook: str = HOOK, evaluate: str | None = EVAL, tail: str = "") -> str:
    parts = [head, build, data, hook]
    if inputs is not None:
        parts.append(inputs)
    if evaluate is not None:
        parts.append(evaluate)
    parts.append(tail)
    return "\n".join(textwrap.dedent(p) for p in parts)


OK = model_src()
FRAGILE = model_src(build=BUILD_FRAGILE, data=DATA_FRAGILE)


def slow(sleep: float, base: str = "ok") -> str:
    build, data = (BUILD_FRAGILE, DATA_FRAGILE) if base == "fragile" else (BUILD, DATA)
    return model_src(build=build, data=data, hook=HOOK_SLOW % {"sleep": sleep})


# ----------------------------------------------------------------------------------------------------------------
# The harness
# ----------------------------------------------------------------------------------------------------------------
class SetupFailed(Exception):
    pass


@dataclass
class Run:
    rc: int | None  # None: timed out
    stdout: str
    stderr: str
    seconds: float


@dataclass
class Ctx:
    """What a case's setup/action/note callables get: its temp folder and ways to run mpt there."""

    tmp: Path
    timeout: float
    env: dict[str, str]
    background: list[subprocess.Popen] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    facts: dict = field(default_factory=dict)  # what a setup learnt, for the case's note and check

    def p(self, rel: str) -> Path:
        return self.tmp / rel

    def write(self, rel: str, content: str | bytes) -> Path:
        path = self.tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        return path

    def fmt(self, args: Sequence[str]) -> list[str]:
        return [a.replace("{T}", str(self.tmp)) for a in args]

    def mpt(self, *args: str, expect: int | None = 0) -> Run:
        """Run `mpt ARGS` to completion as part of a setup; a different exit code fails the setup."""
        run = run_process([PY, "-m", "mpt_cli", *self.fmt(args)], self.env, self.timeout)
        if expect is not None and run.rc != expect:
            first = first_line(run.stderr or run.stdout)
            raise SetupFailed(f"setup `mpt {' '.join(args[:2])}` exited {run.rc}: {first}")
        return run

    def spawn(self, *args: str) -> subprocess.Popen:
        """Start `mpt ARGS` in the background (killed when the case ends)."""
        proc = subprocess.Popen([PY, "-m", "mpt_cli", *self.fmt(args)], cwd=ROOT, env=self.env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=_child_signals)
        self.background.append(proc)
        return proc


@dataclass
class Case:
    name: str
    argv: Sequence[str]  # after `python -m mpt_cli`; "{T}" is the case's temp folder
    expect: int | tuple[int, ...]
    files: dict[str, str | bytes] = field(default_factory=dict)
    setup: Callable[[Ctx], None] | None = None
    env: dict[str, str] = field(default_factory=dict)
    action: Callable[[Ctx, subprocess.Popen], None] | None = None  # runs while the command runs
    note: Callable[[Ctx, Run], str] | None = None  # extra facts for the table, after the command
    cmd: Sequence[str] | None = None  # a whole command line instead of `python -m mpt_cli` (argv still appended)
    shown: str | None = None  # how to show `cmd` in the table
    # after the command: why the case failed although its exit code is the expected one (None: it did not)
    check: Callable[[Ctx, Run], str | None] | None = None


def _child_signals() -> None:
    # A battery started from a non-interactive shell with `&` inherits SIGINT ignored, and Python then installs
    # no KeyboardInterrupt handler: give the child the default disposition, as a terminal would.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def run_process(cmd: Sequence[str], env: dict[str, str], timeout: float,
                action: Callable[[subprocess.Popen], None] | None = None, io_dir: Path | None = None) -> Run:
    io_dir = Path(tempfile.mkdtemp(prefix="mpt-fb-io-")) if io_dir is None else io_dir
    out_path, err_path = io_dir / "stdout.txt", io_dir / "stderr.txt"
    t0 = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as errf:
        proc = subprocess.Popen(list(cmd), cwd=ROOT, env=env, stdout=out, stderr=errf, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=_child_signals)
        try:
            if action is not None:
                action(proc)
            rc: int | None = proc.wait(timeout=max(1.0, timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            rc = None
        except BaseException:
            _kill_group(proc)
            raise
    seconds = time.monotonic() - t0
    stdout = out_path.read_text(encoding="utf-8", errors="replace")
    stderr = err_path.read_text(encoding="utf-8", errors="replace")
    shutil.rmtree(io_dir, ignore_errors=True)
    return Run(rc, stdout, stderr, seconds)


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def first_line(text: str) -> str:
    for line in ANSI.sub("", text).splitlines():
        if line.strip():
            return line.strip()
    return ""


def cell(text: str, tmp: Path | None, limit: int | None = None) -> str:
    if tmp is not None:
        text = text.replace(str(tmp), "$TMP")
        real = os.path.realpath(tmp)
        if real != str(tmp):
            text = text.replace(real, "$TMP")
    text = " ".join(text.split())
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text.replace("|", "\\|")


def wait_for(predicate: Callable[[], bool], timeout: float, proc: subprocess.Popen | None = None,
             step: float = 0.05) -> bool:
    """Poll until predicate() holds; False on timeout or when `proc` exits first."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        if proc is not None and proc.poll() is not None:
            return False
        time.sleep(step)
    return False


def journal_lines(path: Path) -> list[dict]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        try:
            found.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return found


def exists_note(ctx: Ctx, rel: str) -> str:
    return f"{rel} {'present' if ctx.p(rel).exists() else 'absent'}"


# ----------------------------------------------------------------------------------------------------------------
# Case helpers
# ----------------------------------------------------------------------------------------------------------------
# Tuned output folders by (model file, folder, extra flags, model source): a case that needs the same tuned run as
# an earlier one gets a copy of it (the plan names its model file relative to the folder and the journal holds
# content digests, so a copy at the same layout is the same run). --no-cache tunes afresh in every case.
_TUNED: dict[tuple, Path] = {}
USE_CACHE = [True]


def tuned(model: str = "m.py", out: str = "out", *extra: str) -> Callable[[Ctx], None]:
    """Setup: tune {T}/MODEL into {T}/OUT (the model file must be in `files`)."""

    def setup(ctx: Ctx) -> None:
        key = (model, out, extra, ctx.p(model).read_bytes())
        if USE_CACHE[0] and key in _TUNED:
            shutil.copytree(_TUNED[key] / out, ctx.p(out))
            return
        ctx.mpt("tune", f"{{T}}/{model}", "--out", f"{{T}}/{out}", "-q", *extra)
        keep = Path(tempfile.mkdtemp(prefix="mpt-fb-cache-"))
        shutil.copytree(ctx.p(out), keep / out)
        _TUNED[key] = keep

    return setup


def chain(*steps: Callable[[Ctx], None]) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        for step in steps:
            step(ctx)

    return setup


def edit(rel: str, fn: Callable[[str], str]) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        path = ctx.p(rel)
        new = fn(path.read_text(encoding="utf-8"))
        path.write_text(new, encoding="utf-8")

    return setup


def edit_bytes(rel: str, fn: Callable[[bytes], bytes]) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        path = ctx.p(rel)
        path.write_bytes(fn(path.read_bytes()))

    return setup


def tune(model: str = "{T}/m.py", *extra: str, out: str = "{T}/out") -> list[str]:
    return ["tune", model, "--out", out, *extra]


def problems_note(ctx: Ctx, run: Run) -> str:
    listed = [ln for ln in run.stderr.splitlines() if ln.strip().startswith("- ")]
    shown = " / ".join(s.strip()[2:][:60].rstrip("; ") for s in listed)
    return f"{len(listed)} problems listed" + (f": {shown}" if listed else "")


def suggestion_note(ctx: Ctx, run: Run) -> str:
    text = run.stderr + run.stdout
    m = re.search(r"(did you mean[^\n]*|closest[^\n]*|nearest[^\n]*)", text, re.I)
    return f"suggests: {m.group(1).strip()}" if m else "no suggestion found in the output"


def no_plan_note(ctx: Ctx, run: Run) -> str:
    out = ctx.p("out")
    left = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    return exists_note(ctx, "out/plan.yaml") + f"; out/ holds: {', '.join(left) or 'nothing'}"


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


def sigterm_in_baseline(ctx: Ctx, proc: subprocess.Popen) -> None:
    log = ctx.p("evals.log")
    if not wait_for(log.exists, 60, proc):
        ctx.notes.append("evaluate never started")
        return
    time.sleep(0.5)  # inside the first baseline evaluation (3 s)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)


def sigterm_note(ctx: Ctx, run: Run) -> str:
    calls = ctx.p("evals.log").read_text().split("\n") if ctx.p("evals.log").exists() else []
    lines = journal_lines(ctx.p("out/journal.jsonl"))
    evals = sum(1 for r in lines if r.get("kind") == "eval")
    return (f"{len([c for c in calls if c])} evaluate call(s); journal {'has ' + str(evals) + ' evals' if lines else 'absent'}; "
            + exists_note(ctx, "out/plan.yaml"))


def budget_note(budget: float, sleep: float) -> Callable[[Ctx, Run], str]:
    def note(ctx: Ctx, run: Run) -> str:
        log = ctx.p("evals.log")
        calls = [c for c in log.read_text().split("\n") if c] if log.exists() else []
        return (f"budget {budget:g} s, evaluate {sleep:g} s: {len(calls)} evaluate calls, wall {run.seconds:.1f} s "
                f"(budget + one evaluation = {budget + sleep:g} s; the budget starts after ~1.5 s of imports)")

    return note


# --- output folder ------------------------------------------------------------------------------------------------
def busy_folder(ctx: Ctx) -> None:
    """Start a slow tune on {T}/out in the background and wait until its journal has a line."""
    proc = ctx.spawn(*tune("{T}/slow.py"))
    if not wait_for(lambda: bool(journal_lines(ctx.p("out/journal.jsonl"))), 60, proc):
        raise SetupFailed(f"background tune did not start a journal (exit {proc.poll()})")


def busy_note(ctx: Ctx, run: Run) -> str:
    bg = ctx.background[0] if ctx.background else None
    alive = bg is not None and bg.poll() is None
    journal = ctx.p("out/journal.jsonl").exists()
    return f"first run still running: {'yes' if alive else 'no'}; its journal {'intact' if journal else 'DELETED'}"


def stale_lock(ctx: Ctx) -> None:
    # a pid that is not running (pid_max is at most 4194304)
    dead = 4194303
    while True:
        try:
            os.kill(dead, 0)
            dead -= 1
        except ProcessLookupError:
            break
        except PermissionError:
            dead -= 1
    ctx.write("out/.mpt.lock", f"pid {dead}, started 2020-01-01 00:00:00\n")


# --- journals -----------------------------------------------------------------------------------------------------
def garbage_in_journal(garbage: bytes) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        path = ctx.p("out/journal.jsonl")
        lines = path.read_bytes().splitlines(keepends=True)
        if len(lines) < 3:
            raise SetupFailed(f"journal has only {len(lines)} lines")
        path.write_bytes(b"".join(lines[:2] + [garbage + b"\n"] + lines[2:]))

    return setup


def torn_header(ctx: Ctx) -> None:
    path = ctx.p("out/journal.jsonl")
    header = path.read_bytes().splitlines()[0]
    for name in ("plan.yaml", "model.safetensors", "report.json", "search.html", "lower_precision_ops.txt",
                 "fp32_ops.txt"):
        ctx.p(f"out/{name}").unlink(missing_ok=True)
    path.write_bytes(header[: len(header) // 2])  # killed while writing the header
    # ... which is before mpt recorded the header's digest: its manifest still says "being written"
    manifest = ctx.p("out/.mpt-manifest.json")
    if manifest.exists():
        data = json.loads(manifest.read_text(encoding="utf-8"))
        data.setdefault("files", {})["journal.jsonl"] = {"sha256": None}
        manifest.write_text(json.dumps(data), encoding="utf-8")


# --- checkpoints / plans ------------------------------------------------------------------------------------------
def flip_tensor_bytes(data: bytes) -> bytes:
    header_len = int.from_bytes(data[:8], "little")
    start = 8 + header_len
    if len(data) - start < 16:
        raise SetupFailed("checkpoint has no tensor data")
    buf = bytearray(data)
    for i in range(start + 4, min(len(buf), start + 36)):
        buf[i] ^= 0xFF
    return bytes(buf)


def truncate_half(data: bytes) -> bytes:
    return data[: len(data) // 2 + 3]


def plan_unknown_key(text: str) -> str:
    return text.replace("fp32_instances:", "fp32_instance_list: []\nfp32_instances:", 1)


def plan_newer_version(text: str) -> str:
    return re.sub(r"^version: 1$", "version: 99", text, count=1, flags=re.M)


def worse_model(text: str) -> str:
    # the metric now amplifies any output error 50x: FP32 still scores ~1, bf16 drops far below the target
    return text.replace("float(1.0 - (y - ref).norm()", "float(1.0 - 50 * (y - ref).norm()", 1)


# --- disk ---------------------------------------------------------------------------------------------------------
ENOSPC_WRAPPER = """\
import errno, sys
import tuner.core.direct_io as dio
def _full(*a, **k):
    raise OSError(errno.ENOSPC, 'No space left on device')
dio.DirectWriter._flush = _full
sys.argv[0] = 'mpt'
from mpt_cli.main import main
main(prog_name='mpt')
"""


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


def time_note(ctx: Ctx, run: Run) -> str:
    return f"took {run.seconds:.1f} s"


def journal_line_edit(fn: Callable[[dict], dict | str]) -> Callable[[Ctx], None]:
    """Setup: replace the journal's first evaluation line by fn(record) (a dict is dumped as JSON)."""

    def setup(ctx: Ctx) -> None:
        path = ctx.p("out/journal.jsonl")
        lines = path.read_text(encoding="utf-8").splitlines()
        if len(lines) < 3:
            raise SetupFailed(f"journal has only {len(lines)} lines")
        new = fn(json.loads(lines[1]))
        lines[1] = new if isinstance(new, str) else json.dumps(new)
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    return setup


def remove(rel: str) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        ctx.p(rel).unlink()

    return setup


def sigint_in_baseline(ctx: Ctx, proc: subprocess.Popen) -> None:
    log = ctx.p("evals.log")
    if not wait_for(log.exists, 60, proc):
        ctx.notes.append("evaluate never started")
        return
    time.sleep(0.5)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)


def rc_note(ctx: Ctx, run: Run) -> str:
    return (f"outputs: {exists_note(ctx, 'out/plan.yaml')}, {exists_note(ctx, 'out/journal.jsonl')}; "
            f"stdout+stderr {len((run.stdout + run.stderr).strip())} chars")


def cuda_expected() -> int:
    try:
        import torch

        return 0 if torch.cuda.is_available() else 2
    except Exception:  # noqa: BLE001
        return 2


BILLION_LAUGHS = "version: 1\n" + 'a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]\n" for i in range(1, 9)) + "model: m.py\n"

BINARY = bytes(range(256)) * 4 + b"\x00\xff\xfe\x80linear\n\x00"


# ----------------------------------------------------------------------------------------------------------------
# The cases
# ----------------------------------------------------------------------------------------------------------------
def cases() -> list[Case]:
    M = {"m.py": OK}
    T = "{T}"
    C: list[Case] = []
    add = C.append

    # --- controls: the harness itself works -----------------------------------------------------------------------
    add(Case("control: tune a good model", tune(), 0, M))
    add(Case("control: check a fresh plan", ["check", f"{T}/out"], 0, M, setup=tuned()))

    # --- model file --------------------------------------------------------------------------------------------------
    add(Case("model: missing file", tune(f"{T}/nosuch.py"), 2))
    add(Case("model: a directory", tune(f"{T}/dir.py"), 2, setup=lambda c: c.p("dir.py").mkdir()))
    add(Case("model: not a .py file", tune(f"{T}/m.txt"), 2, {"m.txt": OK}))
    add(Case("model: syntax error", tune(), 4, {"m.py": OK + "\ndef broken(:\n    pass\n"}))
    add(Case("model: import raises", tune(), 4, {"m.py": OK + "\nraise RuntimeError('no data at import')\n"}))
    add(Case("model: no build_model", tune(), 2, {"m.py": OK.replace("def build_model(", "def make_model(")
                                                                  .replace("ref = build_model()", "ref = make_model()")}))
    add(Case("model: build_model raises", tune(), 4,
             {"m.py": model_src(build="def build_model():\n    raise ValueError('weights not found')\n")}))
    add(Case("model: build_model returns None", tune(), 4,
             {"m.py": model_src(build="def build_model():\n    torch.manual_seed(0)\n    return None\n")}))
    add(Case("model: build_model on the meta device", tune(), 4, {"m.py": model_src(build="""\
def build_model():
    torch.manual_seed(0)
    with torch.device("meta"):
        return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
""")}))
    add(Case("model: evaluate raises", tune(), 4, {"m.py": model_src(evaluate="""\
def evaluate(model):
    raise KeyError('labels')
""")}))
    add(Case("model: evaluate returns None", tune(), 4, {"m.py": model_src(evaluate="def evaluate(model):\n    model(_data(4, 2))\n")}))
    add(Case("model: evaluate returns a string", tune(), 4,
             {"m.py": model_src(evaluate="def evaluate(model):\n    return 'accuracy 0.9'\n")}))
    add(Case("model: evaluate returns NaN (baseline)", tune(), 4,
             {"m.py": model_src(evaluate="def evaluate(model):\n    return float('nan')\n")}))
    add(Case("model: example_inputs raises (inspect)", ["inspect", f"{T}/m.py"], 4,
             {"m.py": model_src(inputs="def example_inputs():\n    raise OSError('sample file missing')\n")}))
    add(Case("model: example_inputs returns a list of batches (inspect: the first is the example)",
             ["inspect", f"{T}/m.py"], 0, {"m.py": model_src(inputs="def example_inputs():\n    return [_data(2, 1)]\n")}))
    add(Case("model: example_inputs returns a list inside the list (inspect)", ["inspect", f"{T}/m.py"], 4,
             {"m.py": model_src(inputs="def example_inputs():\n    return [[_data(2, 1)]]\n")}))
    wrong_shape = {"m.py": model_src(inputs="def example_inputs():\n    return (torch.randn(2, 5),)\n")}
    add(Case("model: forward raises on example_inputs (inspect)", ["inspect", f"{T}/m.py"], 4, wrong_shape))
    add(Case("model: forward raises on example_inputs (tune)", tune(), 4, wrong_shape))
    add(Case("model: --eval nosuch", tune(f"{T}/m.py", "--eval", "nosuch"), 2, M))
    add(Case("model: --eval other.py:fn, other.py missing", tune(f"{T}/m.py", "--eval", f"{T}/other.py:fn"), 2, M))
    add(Case("model: NUL bytes in the file", tune(), 2, {"m.py": OK.encode() + b"\n# \x00\x00\x00\n"}))

    # --- options -----------------------------------------------------------------------------------------------------
    add(Case("option: --dtype int8", tune(f"{T}/m.py", "--dtype", "int8"), 2, M))
    add(Case("option: --preset torch-cpux (suggestion?)", tune(f"{T}/m.py", "--preset", "torch-cpux"), 2, M,
             note=suggestion_note))
    add(Case("option: --tolerance -1", tune(f"{T}/m.py", "--tolerance", "-1"), 2, M))
    add(Case("option: --max-evals 1", tune(f"{T}/m.py", "--max-evals", "1"), 2, M))
    add(Case("option: --time-budget 0", tune(f"{T}/m.py", "--time-budget", "0"), 2, M))
    add(Case("option: --resume --overwrite", tune(f"{T}/m.py", "--resume", "--overwrite"), 2, M))
    add(Case("option: --device cuda without CUDA", tune(f"{T}/m.py", "--device", "cuda"), cuda_expected(), M))
    add(Case("option: --out is an existing file", tune(out=f"{T}/out.txt"), 2, {**M, "out.txt": "not a folder\n"},
             note=lambda c, r: f"out.txt {'intact' if c.p('out.txt').read_text() == 'not a folder' + chr(10) else 'CHANGED'}"))
    add(Case("option: --out unwritable (/proc/mpt-out)", tune(out="/proc/mpt-out"), 2, M))

    # --- output folder -----------------------------------------------------------------------------------------------
    add(Case("out: second run, no --resume/--overwrite", tune(), 2, M, setup=tuned()))
    add(Case("out: concurrent run on the same --out (--overwrite)", tune(f"{T}/m.py", "--overwrite"), 2,
             {**M, "slow.py": slow(1.0)}, setup=busy_folder, note=busy_note))
    add(Case("out: stale .mpt.lock (dead pid, no holder)", tune(), 0, M, setup=stale_lock,
             note=lambda c, r: exists_note(c, "out/plan.yaml")))

    # --- journal / resume --------------------------------------------------------------------------------------------
    add(Case("journal: --resume after editing the model file", tune(f"{T}/m.py", "--resume"), 2, M,
             setup=chain(tuned(), edit("m.py", lambda s: s + "\n# edited\n"))))
    add(Case("journal: --resume with another --tolerance", tune(f"{T}/m.py", "--resume", "--tolerance", "0.05"), 2, M,
             setup=tuned()))
    add(Case("journal: garbage line in the middle", tune(f"{T}/m.py", "--resume"), 2, M,
             setup=chain(tuned(), garbage_in_journal(b"{this is not json"))))
    add(Case("journal: non-UTF-8 line in the middle", tune(f"{T}/m.py", "--resume"), 2, M,
             setup=chain(tuned(), garbage_in_journal(b"\xff\xfe\x80garbage\x00"))))
    add(Case("journal: torn inside its header, --resume", tune(f"{T}/m.py", "--resume"), 0, M,
             setup=chain(tuned(), torn_header), note=lambda c, r: exists_note(c, "out/plan.yaml")))
    add(Case("journal: --resume on an empty folder", tune(f"{T}/m.py", "--resume"), 0, M,
             setup=lambda c: c.p("out").mkdir(), note=lambda c, r: exists_note(c, "out/plan.yaml")))

    # --- signals -----------------------------------------------------------------------------------------------------
    add(Case("signal: SIGINT after a passing trial", tune(), 130,
             {"m.py": model_src(build=BUILD_FRAGILE, data=DATA_FRAGILE, hook=HOOK_SLOW_AFTER_PASS)},
             action=sigint_after_pass, note=sigint_note))
    add(Case("signal: SIGTERM during the baseline", tune(), 130, {"m.py": slow(3.0)}, action=sigterm_in_baseline,
             note=sigterm_note))
    add(Case("signal: --time-budget 3, evaluate sleeps 2 s", tune(f"{T}/m.py", "--time-budget", "3"), 3,
             {"m.py": slow(2.0, "fragile")}, note=budget_note(3, 2)))
    add(Case("signal: --time-budget 4, evaluate sleeps 1 s", tune(f"{T}/m.py", "--time-budget", "4"), 3,
             {"m.py": slow(1.0, "fragile")}, note=budget_note(4, 1)))

    # --- config YAML -------------------------------------------------------------------------------------------------
    def cfg(text: str | bytes) -> dict[str, str | bytes]:
        return {**M, "mpt.yaml": text}

    good_cfg = "version: 1\nmodel: m.py\nout: out\ntolerance: 0.01\n"
    add(Case("config: unknown key (suggestion?)", ["tune", "--config", f"{T}/mpt.yaml"], 2,
             cfg(good_cfg + "tolerence: 0.02\n"), note=suggestion_note))
    add(Case("config: wrong type", ["tune", "--config", f"{T}/mpt.yaml"], 2,
             cfg(good_cfg.replace("tolerance: 0.01", "tolerance: one percent"))))
    add(Case("config: missing version", ["tune", "--config", f"{T}/mpt.yaml"], 2,
             cfg(good_cfg.replace("version: 1\n", ""))))
    add(Case("config: several errors at once", ["tune", "--config", f"{T}/mpt.yaml"], 2,
             cfg("version: 7\nmodel: m.py\nout: out\ntolerance: -3\nmax_evals: two\ndtype: int8\nbogus: 1\n"),
             note=problems_note))
    add(Case("config: YAML alias bomb (9 levels)", ["tune", "--config", f"{T}/mpt.yaml"], 2, cfg(BILLION_LAUGHS),
             note=time_note))
    add(Case("config: a list, not a mapping", ["tune", "--config", f"{T}/mpt.yaml"], 2,
             cfg("- version: 1\n- model: m.py\n")))
    add(Case("config: malformed YAML", ["tune", "--config", f"{T}/mpt.yaml"], 2,
             cfg("version: 1\nmodel: [m.py\nout: {out\n")))
    add(Case("config: UTF-8 BOM", ["tune", "--config", f"{T}/mpt.yaml"], 0, cfg(b"\xef\xbb\xbf" + good_cfg.encode()),
             note=lambda c, r: exists_note(c, "out/plan.yaml")))

    # --- op lists ----------------------------------------------------------------------------------------------------
    def lists(**files: str | bytes) -> dict[str, str | bytes]:
        return {**M, **files}

    add(Case("oplist: unknown op name (suggestion?)", ["inspect", f"{T}/m.py", "--lower-list", f"{T}/lower.txt"], 2,
             lists(**{"lower.txt": "linear\nlineer\nmatmul\n"}), note=suggestion_note))
    add(Case("oplist: duplicate op", ["inspect", f"{T}/m.py", "--lower-list", f"{T}/lower.txt"], 2,
             lists(**{"lower.txt": "linear\nmatmul\nlinear\n"})))
    add(Case("oplist: op in both lists", ["inspect", f"{T}/m.py", "--lower-list", f"{T}/lower.txt", "--fp32-list",
                                          f"{T}/fp32.txt"], 2,
             lists(**{"lower.txt": "linear\nmatmul\n", "fp32.txt": "softmax\nlinear\n"})))
    add(Case("oplist: UTF-8 BOM", ["inspect", f"{T}/m.py", "--lower-list", f"{T}/lower.txt"], 0,
             lists(**{"lower.txt": b"\xef\xbb\xbflinear\nmatmul\n"})))
    add(Case("oplist: binary garbage", ["inspect", f"{T}/m.py", "--lower-list", f"{T}/lower.bin"], 2,
             lists(**{"lower.bin": BINARY})))

    # --- plans and checkpoints ---------------------------------------------------------------------------------------
    other = model_src(build="""\
def build_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 4)).eval()
""")
    add(Case("plan: inspect B with A's plan folder", ["inspect", f"{T}/b.py", "--plan", f"{T}/out"], 2,
             {"a.py": FRAGILE, "b.py": other}, setup=tuned("a.py")))
    add(Case("check: missing folder", ["check", f"{T}/nosuch"], 2))
    add(Case("check: folder without plan.yaml", ["check", f"{T}/empty"], 2, setup=lambda c: c.p("empty").mkdir()))
    add(Case("check: corrupted model.safetensors data, --checkpoint", ["check", f"{T}/out", "--checkpoint"], 2, M,
             setup=chain(tuned(), edit_bytes("out/model.safetensors", flip_tensor_bytes))))
    add(Case("check: truncated model.safetensors, --checkpoint", ["check", f"{T}/out", "--checkpoint"], 2, M,
             setup=chain(tuned(), edit_bytes("out/model.safetensors", truncate_half))))
    add(Case("check: plan.yaml with an unknown key", ["check", f"{T}/out"], 2, M,
             setup=chain(tuned(), edit("out/plan.yaml", plan_unknown_key)), note=suggestion_note))
    add(Case("check: plan.yaml from a newer version", ["check", f"{T}/out"], 2, M,
             setup=chain(tuned(), edit("out/plan.yaml", plan_newer_version))))
    add(Case("check: model made worse since tuning", ["check", f"{T}/out"], 3, M,
             setup=chain(tuned(), edit("m.py", worse_model))))

    # --- disk --------------------------------------------------------------------------------------------------------
    add(Case("disk: ENOSPC while writing model.safetensors", tune(), 2, M,
             cmd=[PY, "-c", ENOSPC_WRAPPER], shown="python -c '<the checkpoint write raises ENOSPC; mpt_cli.main.main()>'",
             note=no_plan_note))

    # --- noise -------------------------------------------------------------------------------------------------------
    add(Case("noise: evaluate with +-0.3% seeded noise", tune(f"{T}/m.py", "--tolerance", "0.02"), 0, {"m.py": model_src(hook=HOOK_NOISY)},
             note=noise_note))
    # --- more probes (beyond the brief's list) -----------------------------------------------------------------------
    add(Case("model: evaluate calls sys.exit(0)", tune(), 4,
             {"m.py": model_src(evaluate="def evaluate(model):\n    import sys\n    sys.exit(0)\n")}, note=rc_note))
    add(Case("model: build_model calls sys.exit(3)", tune(), 4,
             {"m.py": model_src(build="def build_model():\n    import sys\n    sys.exit(3)\n")}, note=rc_note))
    add(Case("model: evaluate returns inf (baseline)", tune(), 4,
             {"m.py": model_src(evaluate="def evaluate(model):\n    return float('inf')\n")}))
    add(Case("model: evaluate returns a 0-d tensor", tune(), 0, {"m.py": OK.replace(
        "return _after(float(1.0 - (y - ref).norm() / ref.norm()))",
        "return (1.0 - (y - ref).norm() / ref.norm()).float()")}))
    add(Case("model: evaluate trains the model, build_model unseeded", tune(), 4, {"m.py": model_src(
        build="def build_model():\n    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()\n",
        evaluate="""\
@torch.no_grad()
def evaluate(model):
    for p in model.parameters():
        p.add_(0.01)
    return float(model(_data(8, 2)).abs().mean())
""")}))
    add(Case("option: --max-evals 0 (README: N >= 2)", tune(f"{T}/m.py", "--max-evals", "0"), 2, M))
    add(Case("option: --tolerance nan", tune(f"{T}/m.py", "--tolerance", "nan"), 2, M))
    add(Case("journal: a JSON line that is not an object", tune(f"{T}/m.py", "--resume"), 2, M,
             setup=chain(tuned(), garbage_in_journal(b"[1, 2, 3]"))))
    add(Case("journal: eval line with a non-number metric", tune(f"{T}/m.py", "--resume"), 2, M,
             setup=chain(tuned(), journal_line_edit(lambda r: {**r, "metric": "high"}))))
    add(Case("journal: eval line without its fields", tune(f"{T}/m.py", "--resume"), 2, M,
             setup=chain(tuned(), journal_line_edit(lambda r: {"kind": "eval", "key": r["key"]}))))
    add(Case("signal: SIGINT during the baseline", tune(), 130, {"m.py": slow(3.0)}, action=sigint_in_baseline,
             note=sigterm_note))
    add(Case("config: file missing", ["tune", "--config", f"{T}/nosuch.yaml"], 2, M))
    add(Case("config: model file missing", ["tune", "--config", f"{T}/mpt.yaml"], 2,
             {"mpt.yaml": "version: 1\nmodel: nosuch.py\nout: out\n"}))
    add(Case("config: empty file", ["tune", "--config", f"{T}/mpt.yaml"], 2, {**M, "mpt.yaml": ""}))
    add(Case("presets: unknown name (suggestion?)", ["presets", "hmpp"], 2, note=suggestion_note))
    add(Case("inspect: --module without '='", ["inspect", f"{T}/m.py", "--module", "0"], 2, M))
    add(Case("inspect: --module with a bad dtype", ["inspect", f"{T}/m.py", "--module", "0=int8"], 2, M))
    add(Case("inspect: --top -1", ["inspect", f"{T}/m.py", "--top", "-1"], 2, M))
    add(Case("inspect: --plan file missing", ["inspect", f"{T}/m.py", "--plan", f"{T}/nosuch.yaml"], 2, M))
    add(Case("check: empty plan.yaml", ["check", f"{T}/out"], 2, M,
             setup=chain(tuned(), edit("out/plan.yaml", lambda s: ""))))
    add(Case("check: binary plan.yaml", ["check", f"{T}/out"], 2, M,
             setup=chain(tuned(), edit_bytes("out/plan.yaml", lambda b: BINARY))))
    add(Case("check: malformed fp32_instances entries", ["check", f"{T}/out"], 2, M,
             setup=chain(tuned(), edit("out/plan.yaml", lambda s: s.replace(
                 "fp32_instances: []", "fp32_instances: [42, {module: x}]")))))
    add(Case("check: --checkpoint without model.safetensors", ["check", f"{T}/out", "--checkpoint"], 2, M,
             setup=chain(tuned(), remove("out/model.safetensors"))))
    add(Case("check: the plan's model file was deleted", ["check", f"{T}/out"], 2, M,
             setup=chain(tuned(), remove("m.py"))))
    add(Case("check: --junit in an unwritable place", ["check", f"{T}/out", "--junit", "/proc/mpt-check.xml"], 2, M,
             setup=tuned()))
    # --- issue 17's classes (benchmarks/fault_cases_issue17.py) -----------------------------------------------------
    from fault_cases_issue17 import issue17_cases

    C.extend(issue17_cases(sys.modules[__name__]))
    # --- issue 34's classes (benchmarks/fault_cases_issue34.py) -----------------------------------------------------
    from fault_cases_issue34 import issue34_cases

    C.extend(issue34_cases(sys.modules[__name__]))
    return C


# ----------------------------------------------------------------------------------------------------------------
def run_case(case: Case, timeout: float) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="mpt-fb-"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **case.env}
    ctx = Ctx(tmp, timeout, env)
    argv = ctx.fmt(case.argv)
    cmd = [*(case.cmd or [PY, "-m", "mpt_cli"]), *argv]
    shown = (case.shown or "mpt") + " " + " ".join(shlex.quote(a) for a in argv)
    row = {"case": case.name, "command": cell(shown, tmp), "expect": case.expect}
    try:
        for rel, content in case.files.items():
            ctx.write(rel, content)
        if case.setup is not None:
            case.setup(ctx)
        io_dir = Path(tempfile.mkdtemp(prefix="mpt-fb-io-"))
        action = (lambda proc: case.action(ctx, proc)) if case.action else None
        run = run_process(cmd, env, timeout, action, io_dir)
        notes = list(ctx.notes)
        if case.note is not None:
            try:
                notes.append(case.note(ctx, run))
            except Exception as exc:  # noqa: BLE001 - a note must not lose the row
                notes.append(f"(note failed: {type(exc).__name__}: {exc})")
        if case.check is not None:
            try:
                problem = case.check(ctx, run)
            except Exception as exc:  # noqa: BLE001 - a check that breaks fails its case, not the battery
                problem = f"check failed: {type(exc).__name__}: {exc}"
            if problem:
                row["problem"] = problem
                notes.insert(0, f"FAILED: {problem}")
        if run.rc is None:
            notes.insert(0, f"TIMED OUT after {timeout:g} s")
        line = first_line(run.stderr) or first_line(run.stdout)
        if line.startswith("Usage:"):  # a click usage error: its message is further down
            msg = next((ln.strip() for ln in run.stderr.splitlines() if "Error" in ln), "")
            if msg:
                notes.insert(0, msg)
        row.update(rc=run.rc, seconds=run.seconds, line=cell(line, tmp, 110), note=cell("; ".join(notes), tmp, 300),
                   stderr=run.stderr.replace(str(tmp), "$TMP"))
    except SetupFailed as exc:
        row.update(rc=None, seconds=0.0, line="", note=cell(f"SETUP FAILED: {exc}", tmp), stderr="")
    finally:
        for proc in ctx.background:
            _kill_group(proc)
        shutil.rmtree(tmp, ignore_errors=True)
    return row


def run_all(selected: list[tuple[int, Case]], timeout: float) -> list[dict]:
    rows = []
    for n, case in selected:
        print(f"[{n:2d}] {case.name} ...", end="", file=sys.stderr, flush=True)
        row = run_case(case, timeout)
        row["n"] = n
        row["ok"] = row["rc"] in (case.expect if isinstance(case.expect, tuple) else (case.expect,)) \
            and not row.get("problem")
        rows.append(row)
        verdict = "ok" if row["ok"] else "FAILED its check" if row.get("problem") else f"expected {case.expect}"
        print(f" exit {row['rc']} ({verdict}) {row['seconds']:.1f}s", file=sys.stderr, flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", metavar="SUBSTRING", help="run only the cases whose name contains SUBSTRING")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per case (default 120)")
    ap.add_argument("--no-cache", action="store_true",
                    help="tune afresh in every case that needs a tuned folder (default: copy the first one)")
    args = ap.parse_args(argv)
    USE_CACHE[0] = not args.no_cache

    selected = [(n, c) for n, c in enumerate(cases(), 1) if not args.only or args.only.lower() in c.name.lower()]
    rows = []
    t_all = time.monotonic()
    try:
        rows = run_all(selected, args.timeout)
    finally:
        for keep in _TUNED.values():
            shutil.rmtree(keep, ignore_errors=True)

    import torch  # only for the machine line

    print(f"# mpt fault battery\n")
    print(f"{len(rows)} cases in {time.monotonic() - t_all:.0f} s; python {sys.version.split()[0]}, torch "
          f"{torch.__version__}, {os.cpu_count()} CPUs. `$TMP` is each case's fresh temp folder; `mpt` is "
          f"`python -m mpt_cli` run from the repository root.\n")
    headers = ["#", "case", "command", "exit", "expected", "seconds", "first stderr line", "note"]
    print("| " + " | ".join(headers) + " |")
    print("|" + "|".join(["---:", "---", "---", "---:", "---:", "---:", "---", "---"]) + "|")
    for r in rows:
        exp = "/".join(map(str, r["expect"])) if isinstance(r["expect"], tuple) else str(r["expect"])
        rc = "timeout" if r["rc"] is None and "TIMED OUT" in r["note"] else ("-" if r["rc"] is None else str(r["rc"]))
        mark = "" if r["ok"] else " ✗"
        print(f"| {r['n']} | {cell(r['case'], None)} | `{r['command']}` | {rc}{mark} | {exp} | {r['seconds']:.1f} | "
              f"{r['line']} | {r['note']} |")
    bad = [r for r in rows if not r["ok"]]
    print(f"\n**{len(bad)} of {len(rows)} cases exited with another code than expected, or failed their check.**")
    for r in bad:
        exp = "/".join(map(str, r["expect"])) if isinstance(r["expect"], tuple) else str(r["expect"])
        why = r.get("problem") or r["line"] or r["note"]
        print(f"- #{r['n']} {r['case']}: exit {r['rc']}, expected {exp}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

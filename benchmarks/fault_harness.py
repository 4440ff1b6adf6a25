"""The fault battery's harness: the case type, the runner (one subprocess per case, in a fresh temp folder) and
the table, with the setups and notes that cases of several classes share.

The case modules (`fault_cases_*.py`, one per group of classes) import this module and `fault_models`;
`fault_battery.py` imports them all and runs what `--only` selects. Nothing here imports a case module.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


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


def took(ctx: Ctx, run: Run) -> str:
    return f"took {run.seconds:.1f} s"


def intact(rel: str, content: str | bytes) -> Callable:
    def note(ctx, run) -> str:
        path = ctx.p(rel)
        if not path.exists():
            return f"{rel} DELETED"
        data = path.read_bytes()
        want = content.encode() if isinstance(content, str) else content
        return f"{rel} {'intact' if data == want else 'REPLACED'}"

    return note


def warned(word: str) -> Callable:
    def note(ctx, run) -> str:
        text = (run.stdout + run.stderr).lower()
        return f"warning naming '{word}': {'yes' if word.lower() in text else 'NO'}"

    return note


def mentions(word: str) -> Callable:
    def note(ctx, run) -> str:
        text = run.stdout + run.stderr
        tb = "traceback!" if "Traceback" in text else "no traceback"
        return f"names {word}: {'yes' if word in text else 'NO'}; {tb}"

    return note


# A tune followed by `mpt check --checkpoint` on its folder, as one command: the case's exit code is the tune's,
# else the check's.
TUNE_CHECK = """\
import subprocess, sys
args = sys.argv[1:]
out = args[args.index('--out') + 1]
rc = subprocess.run([sys.executable, '-m', 'mpt_cli', *args]).returncode
if rc == 0:
    rc = subprocess.run([sys.executable, '-m', 'mpt_cli', 'check', out, '--checkpoint']).returncode
sys.exit(rc)
"""


def loads(ctx, run) -> str:
    """Note: the plan loads back onto a fresh build_model() (tuner.load) and runs its example inputs."""
    if not ctx.p("out/plan.yaml").exists():
        return "plan.yaml absent"
    code = ("import sys, importlib.util, torch, tuner\n"
            f"spec = importlib.util.spec_from_file_location('m', {str(ctx.p('m.py'))!r})\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            f"model = tuner.load(m.build_model(), {str(ctx.p('out'))!r})\n"
            "with torch.no_grad():\n    model(*m.example_inputs())\nprint('loaded')\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=str(ctx.tmp), env=ctx.env, capture_output=True, text=True,
                       timeout=120)
    if r.returncode == 0:
        return "plan loads and runs (tuner.load)"
    tail = (r.stderr.strip().splitlines() or ["?"])[-1]
    return f"LOAD FAILED: {tail}"


def tune_then_check(name: str, flags: Sequence[str], expect: int | tuple[int, ...], source: str) -> Case:
    """A case that tunes {T}/m.py (holding `source`) with `flags`, then checks its folder with --checkpoint; its
    note says whether the plan loads back and runs."""
    return Case(f"{name}, then check --checkpoint", tune("{T}/m.py", *flags), expect, {"m.py": source},
                cmd=[PY, "-c", TUNE_CHECK], shown="mpt tune ... && mpt check $TMP/out --checkpoint:", note=loads)


# ----------------------------------------------------------------------------------------------------------------
# The runner and the table
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


def _expected(expect: int | tuple[int, ...]) -> str:
    return "/".join(map(str, expect)) if isinstance(expect, tuple) else str(expect)


def print_table(rows: list[dict], seconds: float) -> None:
    """The Markdown table of the rows run_all made, then the cases that failed."""
    import torch  # only for the machine line

    print("# mpt fault battery\n")
    print(f"{len(rows)} cases in {seconds:.0f} s; python {sys.version.split()[0]}, torch "
          f"{torch.__version__}, {os.cpu_count()} CPUs. `$TMP` is each case's fresh temp folder; `mpt` is "
          f"`python -m mpt_cli` run from the repository root.\n")
    headers = ["#", "case", "command", "exit", "expected", "seconds", "first stderr line", "note"]
    print("| " + " | ".join(headers) + " |")
    print("|" + "|".join(["---:", "---", "---", "---:", "---:", "---:", "---", "---"]) + "|")
    for r in rows:
        rc = "timeout" if r["rc"] is None and "TIMED OUT" in r["note"] else ("-" if r["rc"] is None else str(r["rc"]))
        mark = "" if r["ok"] else " ✗"
        print(f"| {r['n']} | {cell(r['case'], None)} | `{r['command']}` | {rc}{mark} | {_expected(r['expect'])} | "
              f"{r['seconds']:.1f} | {r['line']} | {r['note']} |")
    bad = [r for r in rows if not r["ok"]]
    print(f"\n**{len(bad)} of {len(rows)} cases exited with another code than expected, or failed their check.**")
    for r in bad:
        why = r.get("problem") or r["line"] or r["note"]
        print(f"- #{r['n']} {r['case']}: exit {r['rc']}, expected {_expected(r['expect'])}: {why}")

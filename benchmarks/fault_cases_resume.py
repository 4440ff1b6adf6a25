"""Fault class `resume`: a tune stopped at each of its phases (the baseline, finding the candidates, the all-low
trial, the ranking, search trial k for the first, middle and last k, the result, measuring the report, renaming the
outputs into place) by SIGINT or SIGTERM, or killed (SIGKILL, `os._exit` in evaluate), then
`mpt tune ... --resume`. The first run exits 130 (a kill: its own code), keeping the best plan confirmed so
far once a trial passed; the resumed one exits 0 having made exactly the evaluations left (the uninterrupted
run's count, plus the one in flight; counted in `evals.log` beside the model file), and its plan.yaml,
fp32_ops.txt and lower_precision_ops.txt are the uninterrupted run's byte for byte (the checkpoint too:
plan.yaml holds its sha256), as are report.json's trials (label, FP32 set, metric, verdict), with every
output its manifest's and no staging folder left. The model is the battery's fragile MLP (5 evaluations
when evaluate is deterministic); its evaluate shuffles the data with a fixed torch seed (`reseeds`), and the
`noisy` one also adds seeded noise of +-0.1% (9 evaluations: the baseline runs 5 times). The model file
stops where `stop.txt` beside it says (an evaluation by number, or a forward mpt runs in a phase, told from
the call stack): it writes `inflight` and sleeps, and the battery sends the signal.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fault_harness import _TUNED, PY, USE_CACHE, Case, Ctx, Run, first_line, run_process, tune, wait_for
from fault_models import BUILD_FRAGILE, DATA_FRAGILE

CLASSES = ("resume",)
T = "{T}"  # the case's temp folder, in argv

# --- resume: interrupted at a phase, then --resume -------------------------------------------------------------------
# The battery's fragile MLP (fault_models.BUILD_FRAGILE/DATA_FRAGILE) as a Sequential whose forward can stop where
# stop.txt says; evaluate counts its calls in evals.log and shuffles its data with a fixed torch seed, drawing
# after the seed (so the state it leaves torch's generator in is its own, not build_model's).
RESUME_HEAD = """\
import os, sys, time, random
import torch
from torch import nn
HERE = os.path.dirname(os.path.abspath(__file__))
_CALLS = [0]
_IN = [False]
_NOISE = random.Random(0)
# where mpt runs the model outside evaluate: (file, function) on the call stack -> the phase
_PHASES = {("session.py", "find_candidates"): "candidates", ("session.py", "rank"): "rank",
           ("session.py", "result"): "result", ("measuring.py", "measure_report"): "report"}
def _phase():
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        found = _PHASES.get((os.path.basename(code.co_filename), code.co_name))
        if found:
            return found
        frame = frame.f_back
    return None
def _stop_in(where):
    # stop.txt: '<where> sleep' (write `inflight`, sleep: the battery signals) or '<where> exit' (a crash)
    try:
        with open(os.path.join(HERE, "stop.txt")) as fh:
            want, how = fh.read().strip().rsplit(" ", 1)
    except OSError:
        return
    if where != want:
        return
    with open(os.path.join(HERE, "inflight"), "w") as fh:
        fh.write(where)
    if how == "exit":
        os._exit(3)
    time.sleep(120)
class Net(nn.Sequential):
    def forward(self, x):
        if not _IN[0]:
            _stop_in(_phase())
        return super().forward(x)
"""
RESUME_EVAL = """\
def example_inputs():
    return (_data(2, 1),)
@torch.no_grad()
def evaluate(model):
    _CALLS[0] += 1
    with open(os.path.join(HERE, "evals.log"), "a") as fh:
        fh.write(f"{_CALLS[0]} {os.getpid()}\\n")
    _IN[0] = True
    try:
        _stop_in(f"eval {_CALLS[0]}")
        ref = build_model().double()
        torch.manual_seed(0)  # a loader that shuffles with a fixed seed
        x = _data(64, 2)[torch.randperm(64)]
        y = model(x).double()
        r = ref(x.double())
        return float(1.0 - (y - r).norm() / r.norm())%(noise)s
    finally:
        _IN[0] = False
"""
RESUME_NOISE = {"reseeds": "", "noisy": " * (1.0 + _NOISE.uniform(-1e-3, 1e-3))"}

# The first run under this wrapper stops while the outputs are renamed into place: at the rename of `target` into
# --out it writes `inflight` and sleeps (the battery signals). Only mpt's own os.replace calls go into --out.
STOP_RENAMING = """\
import os, sys, time
target = %(target)r
out = os.path.abspath(sys.argv[sys.argv.index('--out') + 1])
_replace = os.replace
def replace(src, dst, *args, **kwargs):
    if os.path.abspath(os.fspath(dst)) == os.path.join(out, target):
        with open(os.path.join(os.path.dirname(out), 'inflight'), 'w') as fh:
            fh.write('renaming ' + target)
        time.sleep(120)
    return _replace(src, dst, *args, **kwargs)
os.replace = replace
sys.argv[0] = 'mpt'
from mpt_cli.main import main
main(prog_name='mpt')
"""

COMPARED = ("plan.yaml", "fp32_ops.txt", "lower_precision_ops.txt")  # byte for byte against the uninterrupted run
OUTPUTS = COMPARED + ("model.safetensors", "report.json", "report.md", "search.html")
_REFERENCES: dict[str, tuple[Path, int]] = {}  # model source -> (uninterrupted run's folder, its evaluate calls)


def resume_model(kind: str) -> str:
    """The model file of a `kind` evaluate (RESUME_NOISE)."""
    build = BUILD_FRAGILE.replace("nn.Sequential(", "Net(")
    return "\n".join([RESUME_HEAD, build, DATA_FRAGILE, RESUME_EVAL % {"noise": RESUME_NOISE[kind]}])


@dataclass(frozen=True)
class Interrupt:
    """Where the first run stops and how: `where` is what stop.txt names (`eval N`, a phase), or `renaming
    FILE` (the STOP_RENAMING wrapper); `sig` the signal the battery sends once the run is there (None: the model
    file ends the process itself, os._exit(3)); `in_flight` whether an evaluation is cut off (it is made again);
    `kept` whether plan.yaml must be there after it (a passing trial was confirmed and the search was stopped)."""

    where: str
    sig: signal.Signals | None
    in_flight: bool
    kept: bool = False

    @property
    def first_rc(self) -> int:
        """The first run's exit code: 130 for SIGINT/SIGTERM, the signal's for a kill, 3 for os._exit(3)."""
        if self.sig is None:
            return 3
        return -int(self.sig) if self.sig is signal.SIGKILL else 130


def _calls(ctx: Ctx) -> int:
    log = ctx.p("evals.log")
    return len([ln for ln in log.read_text().splitlines() if ln.strip()]) if log.exists() else 0


def _reference(ctx: Ctx, flags: tuple[str, ...]) -> int:
    """The uninterrupted run into {T}/ref (made once per model source, then copied); its evaluate calls."""
    source = ctx.p("m.py").read_text(encoding="utf-8")
    if USE_CACHE[0] and source in _REFERENCES:
        folder, calls = _REFERENCES[source]
        shutil.copytree(folder, ctx.p("ref"))
        return calls
    ctx.mpt(*tune("{T}/m.py", *flags, out="{T}/ref"))
    calls = _calls(ctx)
    ctx.p("evals.log").unlink(missing_ok=True)
    keep = Path(tempfile.mkdtemp(prefix="mpt-fb-cache-"))
    shutil.copytree(ctx.p("ref"), keep / "ref")
    _TUNED[("resume reference", source)] = keep  # removed with the battery's other copies
    _REFERENCES[source] = (keep / "ref", calls)
    return calls


def interrupted(stop: Interrupt, flags: tuple[str, ...]) -> Callable[[Ctx], None]:
    """Setup: the uninterrupted run (ctx.facts['n']: its evaluate calls), then the run `stop` ends (its exit
    code, calls and whether plan.yaml is there in ctx.facts); stop.txt and the marker removed for --resume."""

    def signal_there(ctx: Ctx, proc: subprocess.Popen) -> None:
        if not wait_for(ctx.p("inflight").exists, 90, proc):
            ctx.facts["missed"] = f"the run never got to {stop.where}"
        elif stop.sig is not None and proc.poll() is None:
            proc.send_signal(stop.sig)

    def setup(ctx: Ctx) -> None:
        ctx.facts["n"] = _reference(ctx, flags)
        argv = ctx.fmt(tune("{T}/m.py", *flags))
        if stop.where.startswith("renaming "):
            cmd = [PY, "-c", STOP_RENAMING % {"target": stop.where.split(" ", 1)[1]}, *argv]
        else:
            ctx.write("stop.txt", f"{stop.where} {'sleep' if stop.sig is not None else 'exit'}\n")
            cmd = [PY, "-m", "mpt_cli", *argv]
        first = run_process(cmd, ctx.env, ctx.timeout, lambda proc: signal_there(ctx, proc))
        ctx.facts.update(first_rc=first.rc, first_calls=_calls(ctx), first_line=first_line(first.stderr),
                         first_plan=_plan_state(ctx.p("out")))
        ctx.p("stop.txt").unlink(missing_ok=True)
        ctx.p("inflight").unlink(missing_ok=True)

    return setup


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _manifest(out: Path) -> dict:
    try:
        return json.loads((out / ".mpt-manifest.json").read_text(encoding="utf-8")).get("files", {})
    except (OSError, ValueError):
        return {}


def _plan_state(out: Path) -> str:
    """`absent`, `kept (stopped: X)` or `HALF-WRITTEN` (a plan.yaml its manifest does not vouch for)."""
    plan = out / "plan.yaml"
    if not plan.exists():
        return "absent"
    if (_manifest(out).get("plan.yaml") or {}).get("sha256") != _sha(plan):
        return "HALF-WRITTEN"
    stopped = [ln.split(":", 1)[1].strip() for ln in plan.read_text(encoding="utf-8").splitlines()
               if ln.strip().startswith("stopped:")]
    return f"kept (stopped: {stopped[0] if stopped else '?'})"


def _trials(out: Path) -> list[tuple] | None:
    """report.json's trials as the search made them: what each ran, its metric and verdict (not its seconds, nor
    whether it came from the journal)."""
    try:
        trials = json.loads((out / "report.json").read_text(encoding="utf-8"))["trials"]
    except (OSError, ValueError, KeyError):
        return None
    return [(t.get("n"), t.get("label"), t.get("fp32"), t.get("metric"), t.get("passed")) for t in trials]


def _outputs_problems(ctx: Ctx) -> list[str]:
    """What differs from the uninterrupted run, or is not as its manifest says, in {T}/out after --resume."""
    out, ref = ctx.p("out"), ctx.p("ref")
    problems = [f"{name} differs from the uninterrupted run's" for name in COMPARED
                if not (out / name).exists() or (out / name).read_bytes() != (ref / name).read_bytes()]
    if _trials(out) != _trials(ref):
        problems.append("report.json's trials (label, FP32 set, metric, verdict) differ from the uninterrupted run's")
    manifest = _manifest(out)
    problems += [f"{name} is not its manifest's" for name in OUTPUTS
                 if (out / name).exists() and (manifest.get(name) or {}).get("sha256") != _sha(out / name)]
    problems += [f"{p.name} left behind" for p in out.glob(".mpt-staging*")] if out.is_dir() else []
    return problems


def replay_check(stop: Interrupt) -> Callable[[Ctx, Run], str | None]:
    """The case's check: the first run's exit code and kept plan, the evaluations in all, the outputs."""

    def check(ctx: Ctx, run: Run) -> str | None:
        f = ctx.facts
        problems = [f["missed"]] if "missed" in f else []
        if f.get("first_rc") != stop.first_rc:
            problems.append(f"the interrupted run exited {f.get('first_rc')}, not {stop.first_rc}")
        if stop.kept and not str(f.get("first_plan")).startswith("kept"):
            problems.append(f"no confirmed plan kept by the interrupted run (plan.yaml {f.get('first_plan')})")
        if f.get("first_plan") == "HALF-WRITTEN":
            problems.append("the interrupted run left a plan.yaml its manifest does not vouch for")
        want = f["n"] + int(stop.in_flight)
        if _calls(ctx) != want:
            problems.append(f"{_calls(ctx)} evaluations in all, not {f['n']}" + (" + 1 in flight" if stop.in_flight
                                                                                else ""))
        if run.rc == 0:
            problems += _outputs_problems(ctx)
        return "; ".join(problems) or None

    return check


def replay_note(ctx: Ctx, run: Run) -> str:
    f = ctx.facts
    return (f"interrupted run: exit {f.get('first_rc')}, {f.get('first_calls')} evaluate calls, plan.yaml "
            f"{f.get('first_plan')}; --resume: {_calls(ctx) - f.get('first_calls', 0)} more, {_calls(ctx)} in all "
            f"(uninterrupted: {f.get('n')})")


def cases() -> list[Case]:
    """A tune stopped at each phase, then --resume."""
    C: list[Case] = []
    add = C.append
    R = ("--no-latency",)
    INT, TERM, KILL = signal.SIGINT, signal.SIGTERM, signal.SIGKILL
    stops = [  # (name, evaluate, Interrupt); noisy: 9 evaluations (baseline x5, all-low, trials 7-9), 7 passes
        ("SIGINT during the FP32 baseline", "reseeds", Interrupt("eval 1", INT, True)),
        ("SIGINT during the noisy baseline's third run", "noisy", Interrupt("eval 4", INT, True)),
        ("SIGINT while the candidates are found", "reseeds", Interrupt("candidates", INT, False)),
        ("SIGINT during the all-low trial (1 of 5 evaluations made)", "reseeds", Interrupt("eval 2", INT, True)),
        ("SIGTERM during the all-low trial (1 of 5 evaluations made)", "reseeds", Interrupt("eval 2", TERM, True)),
        ("SIGINT during the ranking", "noisy", Interrupt("rank", INT, False)),
        ("SIGINT during the first search trial", "noisy", Interrupt("eval 7", INT, True)),
        ("SIGTERM during the middle search trial", "noisy", Interrupt("eval 8", TERM, True, kept=True)),
        ("SIGINT during the last search trial", "noisy", Interrupt("eval 9", INT, True, kept=True)),
        ("SIGINT during the result (the chosen plan's recorded forward)", "noisy", Interrupt("result", INT, False)),
        ("SIGINT while measuring the report", "noisy", Interrupt("report", INT, False)),
        ("SIGINT while model.safetensors is renamed into place", "noisy",
         Interrupt("renaming model.safetensors", INT, False)),
        ("SIGTERM while plan.yaml is renamed into place", "noisy", Interrupt("renaming plan.yaml", TERM, False)),
        ("SIGKILL during the middle search trial", "noisy", Interrupt("eval 8", KILL, True)),
        ("os._exit in evaluate during the all-low trial", "reseeds", Interrupt("eval 2", None, True)),
    ]
    for name, kind, stop in stops:
        add(Case(f"resume: {name}, then --resume", tune(f"{T}/m.py", *R, "--resume"), 0,
                 {"m.py": resume_model(kind)}, setup=interrupted(stop, R), note=replay_note,
                 check=replay_check(stop)))

    return C

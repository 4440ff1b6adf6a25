"""Fault classes of what mpt writes and reads back: `out` (the output folder: busy, stale lock, files mpt did not
write, changed or deleted mid-run), `journal` (damaged journals, --resume after a change, sibling files in the
fingerprint), `plan` and `check` (damaged plans and checkpoints, a model made worse, check as strict as tune) and
`disk` (a full disk while writing the checkpoint).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable

from fault_harness import (
    PY,
    Case,
    Ctx,
    Run,
    SetupFailed,
    chain,
    edit,
    edit_bytes,
    exists_note,
    intact,
    journal_lines,
    mentions,
    suggestion_note,
    took,
    tune,
    tuned,
    wait_for,
)
from fault_models import BINARY, BUILD_FRAGILE, DATA_FRAGILE, FRAGILE, HEAD, LEAK_EVAL, OK, deep_yaml, model_src, slow

CLASSES = ("out", "journal", "plan", "check", "disk")
T = "{T}"  # the case's temp folder, in argv
M = {"m.py": OK}  # the battery's MLP: the files of most cases

SIBLING_HEAD = "import metric\n"
SIBLING_EVAL = """\
@torch.no_grad()
def evaluate(model):
    x = _data(64, 2)
    ref = build_model().double()(x.double())
    return metric.score(model(x).double(), ref)
"""
METRIC = "def score(y, ref):\n    return float(1.0 - (y - ref).norm() / ref.norm())\n"
SIBLING = {"m.py": model_src(head=HEAD + SIBLING_HEAD, evaluate=SIBLING_EVAL), "metric.py": METRIC}

# a slow evaluate (0.7 s) that writes evals.log, for the cases that change the folder mid-run
SLOW_EVAL = """\
@torch.no_grad()
def evaluate(model):
    with open(os.path.join(HERE, "evals.log"), "a") as fh:
        fh.write("1\\n")
    time.sleep(0.7)
    x = _data(64, 2)
    ref = build_model().double()(x.double())
    return float(1.0 - (model(x).double() - ref).norm() / ref.norm())
"""


def no_plan_note(ctx: Ctx, run: Run) -> str:
    out = ctx.p("out")
    left = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    return exists_note(ctx, "out/plan.yaml") + f"; out/ holds: {', '.join(left) or 'nothing'}"


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


def after_first_eval(change: Callable) -> Callable:
    """Action: once evaluate has run twice (the baseline), apply `change(ctx)` to the folder mid-run."""

    def action(ctx, proc: subprocess.Popen) -> None:
        log = ctx.p("evals.log")
        ok = wait_for(lambda: log.exists() and len(log.read_text().split()) >= 2, 90, proc)
        if not ok:
            ctx.notes.append("evaluate did not run twice before the run ended")
            return
        change(ctx)

    return action


def rm_out(ctx) -> None:
    shutil.rmtree(ctx.p("out"), ignore_errors=True)


def out_to_file(ctx) -> None:
    rm_out(ctx)
    ctx.p("out").write_text("now a file\n")


def journal_to_dir(ctx) -> None:
    j = ctx.p("out/journal.jsonl")
    j.unlink()
    j.mkdir()


def _set_key(text: str, key: str, value: str) -> str:
    new, n = re.subn(rf"^(\s*){key}:.*$", rf"\g<1>{key}: {value}", text, count=1, flags=re.M)
    if n == 0:
        new = text + f"{key}: {value}\n"
    return new


def _stale_staging(ctx) -> None:
    manifest = ctx.p("out/.mpt-manifest.json")
    data = json.loads(manifest.read_text())
    name = ".mpt-staging-deadbeef"
    (ctx.p("out") / name).mkdir()
    (ctx.p("out") / name / "plan.yaml").write_text("version: 1\n")
    data["staging"] = [*data.get("staging", []), name]
    manifest.write_text(json.dumps(data))


def _staging_note(ctx, run) -> str:
    left = [p.name for p in ctx.p("out").glob(".mpt-staging*")] if ctx.p("out").is_dir() else []
    return f"staging folders left: {', '.join(left) or 'none'}"


def cases() -> list[Case]:
    return [*_out(), *_journal(), *_checks()]


def _out() -> list[Case]:
    """The output folder."""
    W = b"\x00user weights\x00"
    C: list[Case] = []
    add = C.append
    # --- output folder -----------------------------------------------------------------------------------------------
    add(Case("out: second run, no --resume/--overwrite", tune(), 2, M, setup=tuned()))
    add(Case("out: concurrent run on the same --out (--overwrite)", tune(f"{T}/m.py", "--overwrite"), 2,
             {**M, "slow.py": slow(1.0)}, setup=busy_folder, note=busy_note))
    add(Case("out: stale .mpt.lock (dead pid, no holder)", tune(), 0, M, setup=stale_lock,
             note=lambda c, r: exists_note(c, "out/plan.yaml")))
    # --- files in --out that mpt did not write survive every flag ---------------------------------------------
    for flags in ((), ("--resume",), ("--overwrite",)):
        add(Case(f"out: user's model.safetensors, tune {' '.join(flags) or '(plain)'}", tune(f"{T}/m.py", *flags),
                 2, {**M, "out/model.safetensors": W}, note=intact("out/model.safetensors", W)))
    add(Case("out: user's plan.yaml, tune --overwrite", tune(f"{T}/m.py", "--overwrite"), 2,
             {**M, "out/plan.yaml": "mine: 1\n"}, note=intact("out/plan.yaml", "mine: 1\n")))
    add(Case("out: user's report.json beside mpt's run, --resume", tune(f"{T}/m.py", "--resume"), 2, M,
             setup=chain(tuned(), lambda c: c.write("out/report.json", "{}\n")),
             note=intact("out/report.json", "{}\n")))
    add(Case("out: user's notes.txt in --out (not an output name)", tune(), 0, {**M, "out/notes.txt": "keep\n"},
             note=intact("out/notes.txt", "keep\n")))
    add(Case("out: stale staging folder listed in the manifest", tune(f"{T}/m.py", "--overwrite"), 0, M,
             setup=chain(tuned(), _stale_staging), note=_staging_note))

    # --- --out vanishing mid-run ---------------------------------------------------------------------------------
    slow_eval = {"m.py": model_src(build=BUILD_FRAGILE, data=DATA_FRAGILE, evaluate=SLOW_EVAL)}
    add(Case("out: --out deleted mid-run", tune(), 2, slow_eval, action=after_first_eval(rm_out),
             note=mentions("out")))
    add(Case("out: --out replaced by a file mid-run", tune(), 2, slow_eval, action=after_first_eval(out_to_file),
             note=intact("out", "now a file\n")))
    add(Case("out: journal replaced by a folder mid-run", tune(), 2, slow_eval,
             action=after_first_eval(journal_to_dir), note=mentions("journal")))

    return C


def _journal() -> list[Case]:
    """Journals and --resume."""
    C: list[Case] = []
    add = C.append
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
    add(Case("journal: a JSON line that is not an object", tune(f"{T}/m.py", "--resume"), 2, M,
             setup=chain(tuned(), garbage_in_journal(b"[1, 2, 3]"))))
    add(Case("journal: eval line with a non-number metric", tune(f"{T}/m.py", "--resume"), 2, M,
             setup=chain(tuned(), journal_line_edit(lambda r: {**r, "metric": "high"}))))
    add(Case("journal: eval line without its fields", tune(f"{T}/m.py", "--resume"), 2, M,
             setup=chain(tuned(), journal_line_edit(lambda r: {"kind": "eval", "key": r["key"]}))))
    # --- fingerprints cover sibling files -------------------------------------------------------------------------
    add(Case("journal: sibling metric.py edited, --resume", tune(f"{T}/m.py", "--resume"), 2, SIBLING,
             setup=chain(tuned(), edit("metric.py", lambda s: s.replace("1.0 -", "1.0 - 0.5 *"))),
             note=mentions("metric.py")))
    add(Case("journal: sibling metric.py unchanged, --resume", tune(f"{T}/m.py", "--resume"), 0, SIBLING,
             setup=tuned()))
    return C


def _checks() -> list[Case]:
    """Plans, checkpoints, check, the disk."""
    C: list[Case] = []
    add = C.append
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
             cmd=[PY, "-c", ENOSPC_WRAPPER], note=no_plan_note,
             shown="python -c '<the checkpoint write raises ENOSPC; mpt_cli.main.main()>'"))

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
    # --- plan and config values, sizes, depth -----------------------------------------------------------------
    add(Case("plan: quoted lower_is_better \"false\"", ["check", f"{T}/out"], 2, M,
             setup=chain(tuned(), edit("out/plan.yaml", lambda s: _set_key(s, "lower_is_better", '"false"')))))
    add(Case("plan: tolerance as a string", ["check", f"{T}/out"], 2, M,
             setup=chain(tuned(), edit("out/plan.yaml", lambda s: _set_key(s, "tolerance", '"0.01"')))))
    add(Case("plan: nested 200 levels deep", ["check", f"{T}/out"], 2, M,
             setup=chain(tuned(), edit("out/plan.yaml", lambda s: s + deep_yaml(200, "extra")[len("version: 1\n"):]))))
    add(Case("plan: 6 MB plan.yaml", ["check", f"{T}/out"], 2, M,
             setup=chain(tuned(), edit("out/plan.yaml", lambda s: s + "# " + "x" * 6_000_000 + "\n")), note=took))
    add(Case("check: sibling metric.py made 50x stricter", ["check", f"{T}/out"], 3, SIBLING,
             setup=chain(tuned(), edit("metric.py", lambda s: s.replace("1.0 -", "1.0 - 50 *")))))

    # --- check as strict as tune: a mutating evaluate --------------------------------------------------------------
    mut = {"m.py": model_src(evaluate=LEAK_EVAL % "[p.add_(0.05) for p in model.parameters()]")}
    add(Case("check: evaluate mutates the model under check", ["check", f"{T}/out"], 0, mut, setup=tuned()))

    return C

"""Issue 17's fault classes for `benchmarks/fault_battery.py`: one table of cases, each with its expected exit code.

Imported by the battery (`cases()` appends `issue17_cases(battery)`), which passes itself in so that these cases
share its harness (`Case`, `tuned`, the tuned-folder cache). The classes, in order: files in `--out` mpt did not
write, plan and config values and sizes, fingerprints of sibling files, check as strict as tune, the torch global
state, an `evaluate` that does not exercise the forward, containers and odd forwards (trials as deployed),
`--debug` and module patterns, torchrun misconfiguration, out of memory, threads left running, the output folder
vanishing mid-run, `torch.jit.script` models and `example_inputs()` problems.
"""
from __future__ import annotations

import socket
import subprocess
from collections.abc import Callable
from types import ModuleType

# --- model sources -------------------------------------------------------------------------------------------------
BUILD_BF16 = ("def build_model():\n    torch.manual_seed(0)\n"
              "    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval().to(%s)\n")

# evaluate with the metric in a sibling file (metric.py), imported by the model file
SIBLING_HEAD = "import metric\n"
SIBLING_EVAL = """\
@torch.no_grad()
def evaluate(model):
    x = _data(64, 2)
    ref = build_model().double()(x.double())
    return metric.score(model(x).double(), ref)
"""
METRIC = "def score(y, ref):\n    return float(1.0 - (y - ref).norm() / ref.norm())\n"

# leaks one piece of torch global state from evaluate (and still returns a good metric)
LEAK_EVAL = """\
@torch.no_grad()
def evaluate(model):
    x = _data(64, 2)
    ref = build_model().double()(x.double())
    y = model(x).double()
    %s
    return float(1.0 - (y - ref).norm() / ref.norm())
"""

ENCODE_MODEL = """\
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    def forward(self, x):
        return self.body(x)
    def encode(self, x):
        with torch.autocast("cpu", enabled=False):
            return self.body.float()(x.float())
def build_model():
    torch.manual_seed(0)
    return Net().eval()
"""

# a cached trace of the FP32 model: evaluate never runs the tuned forward
TRACE_EVAL = """\
_CACHE = {}
@torch.no_grad()
def evaluate(model):
    x = _data(64, 2)
    if "t" not in _CACHE:
        _CACHE["t"] = torch.jit.trace(build_model(), (x,))
    ref = build_model().double()(x.double())
    y = _CACHE["t"](x).double()
    model(x[:1])  # calls forward once, but the metric ignores it
    return float(1.0 - (y - ref).norm() / ref.norm())
"""

CONST_EVAL = "@torch.no_grad()\ndef evaluate(model):\n    model(_data(64, 2))\n    return 0.9\n"

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

DICT_MODEL = """\
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    def forward(self, features):
        features["out"] = self.body(features["x"])
        return features
def build_model():
    torch.manual_seed(0)
    return Net().eval()
def example_inputs():
    return {"features": {"x": _data(2, 1)}}
@torch.no_grad()
def evaluate(model):
    x = _data(64, 2)
    ref = build_model().double()({"x": x.double()})["out"]
    y = model({"x": x})["out"].double()
    return float(1.0 - (y - ref).norm() / ref.norm())
"""

CONTAINER_MODEL = """\
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.%(kind)s
    def forward(self, x):
        for layer in %(iter)s:
            x = torch.relu(layer(x))
        return x
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.block = Block()
        self.out = nn.Linear(16, 4)
    def forward(self, x):
        return self.out(self.block(self.inp(x)))
def build_model():
    torch.manual_seed(0)
    return Net().eval()
"""
MODULELIST = {"kind": "ModuleList([nn.Linear(16, 16) for _ in range(2)])", "iter": "self.layers"}
MODULEDICT = {"kind": "ModuleDict({'a': nn.Linear(16, 16), 'b': nn.Linear(16, 16)})", "iter": "self.layers.values()"}

FRESH_MODULE_MODEL = """\
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 4)
    def forward(self, x):
        return self.b(nn.SiLU()(self.a(x)))
def build_model():
    torch.manual_seed(0)
    return Net().eval()
"""

PARAMETRIZED_BUILD = """\
import torch.nn.utils.parametrize as P
class Scale(nn.Module):
    def forward(self, w):
        return w * 1.0
def build_model():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    P.register_parametrization(m[0], "weight", Scale())
    return m
"""

NONE_FORWARD_MODEL = """\
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        self.last = None
    def forward(self, x):
        self.last = self.body(x)
def build_model():
    torch.manual_seed(0)
    return Net().eval()
@torch.no_grad()
def evaluate(model):
    x = _data(64, 2)
    ref = build_model().double()
    ref(x.double())
    model(x)
    return float(1.0 - (model.last.double() - ref.last).norm() / ref.last.norm())
"""

NAMEDTUPLE_MODEL = """\
from typing import NamedTuple
class Pair(NamedTuple):
    a: torch.Tensor
    b: torch.Tensor
class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 4)
    def forward(self, p):
        return self.lin(p.a + p.b)
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(8, 16)
        self.head = Head()
    def forward(self, x):
        return self.head(Pair(self.a(x), self.b(x)))
def build_model():
    torch.manual_seed(0)
    return Net().eval()
"""

TRANSFORMER_MODEL = """\
def build_model():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
def _data(n, seed):
    return torch.randn(n, 3, 8, generator=torch.Generator().manual_seed(seed))
"""

SCRIPT_ROOT_BUILD = """\
def build_model():
    torch.manual_seed(0)
    return torch.jit.script(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval())
"""

SCRIPT_SUB_BUILD = """\
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.jit.script(nn.Linear(8, 16))
        self.b = nn.Linear(16, 4)
    def forward(self, x):
        return self.b(torch.relu(self.a(x)))
def build_model():
    torch.manual_seed(0)
    return Net().eval()
"""

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

AUTOCAST_WRAPPER = """\
import sys, torch
sys.argv[0] = 'mpt'
from mpt_cli.main import main
with torch.autocast('cpu', dtype=torch.bfloat16):
    main(prog_name='mpt')
"""


def deep_yaml(depth: int, key: str = "x") -> str:
    return "version: 1\n" + f"{key}: " + "[" * depth + "1" + "]" * depth + "\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- setups and notes -------------------------------------------------------------------------------------------------
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


def took(ctx, run) -> str:
    return f"took {run.seconds:.1f} s"


def after_first_eval(fb: ModuleType, change: Callable) -> Callable:
    """Action: once evaluate has run twice (the baseline), apply `change(ctx)` to the folder mid-run."""

    def action(ctx, proc: subprocess.Popen) -> None:
        log = ctx.p("evals.log")
        ok = fb.wait_for(lambda: log.exists() and len(log.read_text().split()) >= 2, 90, proc)
        if not ok:
            ctx.notes.append("evaluate did not run twice before the run ended")
            return
        change(ctx)

    return action


def rm_out(ctx) -> None:
    import shutil

    shutil.rmtree(ctx.p("out"), ignore_errors=True)


def out_to_file(ctx) -> None:
    rm_out(ctx)
    ctx.p("out").write_text("now a file\n")


def journal_to_dir(ctx) -> None:
    j = ctx.p("out/journal.jsonl")
    j.unlink()
    j.mkdir()


def mentions(word: str) -> Callable:
    def note(ctx, run) -> str:
        text = run.stdout + run.stderr
        tb = "traceback!" if "Traceback" in text else "no traceback"
        return f"names {word}: {'yes' if word in text else 'NO'}; {tb}"

    return note


# --- the cases --------------------------------------------------------------------------------------------------------
def issue17_cases(fb: ModuleType) -> list:
    Case, tune, tuned, chain, edit, model_src, T = fb.Case, fb.tune, fb.tuned, fb.chain, fb.edit, fb.model_src, "{T}"
    OK = fb.OK
    M = {"m.py": OK}
    W = b"\x00user weights\x00"
    C: list = []
    add = C.append

    # --- 5. files in --out that mpt did not write survive every flag ---------------------------------------------
    for flags in ((), ("--resume",), ("--overwrite",)):
        add(Case(f"i17 out: user's model.safetensors, tune {' '.join(flags) or '(plain)'}", tune(f"{T}/m.py", *flags),
                 2, {**M, "out/model.safetensors": W}, note=intact("out/model.safetensors", W)))
    add(Case("i17 out: user's plan.yaml, tune --overwrite", tune(f"{T}/m.py", "--overwrite"), 2,
             {**M, "out/plan.yaml": "mine: 1\n"}, note=intact("out/plan.yaml", "mine: 1\n")))
    add(Case("i17 out: user's report.json beside mpt's run, --resume", tune(f"{T}/m.py", "--resume"), 2, M,
             setup=chain(tuned(), lambda c: c.write("out/report.json", "{}\n")),
             note=intact("out/report.json", "{}\n")))
    add(Case("i17 out: user's notes.txt in --out (not an output name)", tune(), 0, {**M, "out/notes.txt": "keep\n"},
             note=intact("out/notes.txt", "keep\n")))
    add(Case("i17 out: stale staging folder listed in the manifest", tune(f"{T}/m.py", "--overwrite"), 0, M,
             setup=chain(tuned(), _stale_staging), note=_staging_note))

    # --- 3. plan and config values, sizes, depth -----------------------------------------------------------------
    add(Case("i17 plan: quoted lower_is_better \"false\"", ["check", f"{T}/out"], 2, M,
             setup=chain(tuned(), edit("out/plan.yaml", lambda s: _set_key(s, "lower_is_better", '"false"')))))
    add(Case("i17 plan: tolerance as a string", ["check", f"{T}/out"], 2, M,
             setup=chain(tuned(), edit("out/plan.yaml", lambda s: _set_key(s, "tolerance", '"0.01"')))))
    add(Case("i17 plan: nested 200 levels deep", ["check", f"{T}/out"], 2, M,
             setup=chain(tuned(), edit("out/plan.yaml", lambda s: s + deep_yaml(200, "extra")[len("version: 1\n"):]))))
    add(Case("i17 plan: 6 MB plan.yaml", ["check", f"{T}/out"], 2, M,
             setup=chain(tuned(), edit("out/plan.yaml", lambda s: s + "# " + "x" * 6_000_000 + "\n")), note=took))
    add(Case("i17 config: nested 200 levels deep", ["tune", "--config", f"{T}/mpt.yaml"], 2,
             {**M, "mpt.yaml": deep_yaml(200)}, note=took))
    add(Case("i17 config: quoted latency \"false\"", ["tune", "--config", f"{T}/mpt.yaml"], 2,
             {**M, "mpt.yaml": 'version: 1\nmodel: m.py\nout: out\nlatency: "false"\n'}))
    add(Case("i17 oplist: 5 MB lower list", ["inspect", f"{T}/m.py", "--lower-list", f"{T}/lower.txt"], 2,
             {**M, "lower.txt": "linear\n" * 750_000}, note=took))

    # --- 4. fingerprints cover sibling files -------------------------------------------------------------------------
    sib = {"m.py": model_src(head=fb.HEAD + SIBLING_HEAD, evaluate=SIBLING_EVAL), "metric.py": METRIC}
    add(Case("i17 resume: sibling metric.py edited", tune(f"{T}/m.py", "--resume"), 2, sib,
             setup=chain(tuned(), edit("metric.py", lambda s: s.replace("1.0 -", "1.0 - 0.5 *"))),
             note=mentions("metric.py")))
    add(Case("i17 resume: sibling metric.py unchanged", tune(f"{T}/m.py", "--resume"), 0, sib, setup=tuned()))
    add(Case("i17 check: sibling metric.py made 50x stricter", ["check", f"{T}/out"], 3, sib,
             setup=chain(tuned(), edit("metric.py", lambda s: s.replace("1.0 -", "1.0 - 50 *")))))

    # --- 3. check as strict as tune: a mutating evaluate --------------------------------------------------------------
    mut = {"m.py": model_src(evaluate=LEAK_EVAL % "[p.add_(0.05) for p in model.parameters()]")}
    add(Case("i17 check: evaluate mutates the model under check", ["check", f"{T}/out"], 0, mut, setup=tuned()))

    # --- 7. global state -------------------------------------------------------------------------------------------
    add(Case("i17 state: build_model returns bf16", tune(), 4,
             {"m.py": model_src(build=BUILD_BF16 % "torch.bfloat16")}))
    add(Case("i17 state: build_model returns fp16", tune(), 4, {"m.py": model_src(build=BUILD_BF16 % "torch.float16")}))
    add(Case("i17 state: build_model returns float64", tune(), 4,
             {"m.py": model_src(build=BUILD_BF16 % "torch.float64")}))
    add(Case("i17 state: tune inside an open torch.autocast", tune(), 2, M, cmd=[fb.PY, "-c", AUTOCAST_WRAPPER],
             shown="python -c '<with torch.autocast(cpu): mpt_cli.main.main()>'"))
    for what, code in (("default dtype float64", "torch.set_default_dtype(torch.float64)"),
                       ("grad mode off", "torch.set_grad_enabled(False)"),
                       ("an open autocast", "torch.autocast('cpu', dtype=torch.bfloat16).__enter__()"),
                       ("thread count 1", "torch.set_num_threads(1)")):
        leak = LEAK_EVAL.replace("@torch.no_grad()\n", "") if "grad" in code else LEAK_EVAL  # no_grad() restores it
        add(Case(f"i17 state: evaluate leaks {what}", tune(), 0, {"m.py": model_src(evaluate=leak % code)},
                 note=warned("evaluate")))
    add(Case("i17 state: example_inputs leaks default dtype float64", tune(), 0, {"m.py": model_src(
        inputs="def example_inputs():\n    torch.set_default_dtype(torch.float64)\n"
               "    return (_data(2, 1).float(),)\n")},
        note=warned("example_inputs")))
    add(Case("i17 state: default dtype float64 set at import", tune(), 4,
             {"m.py": OK + "\ntorch.set_default_dtype(torch.float64)\n"}))

    # --- 2. evaluate must exercise what is tuned ----------------------------------------------------------------------
    enc_eval = LEAK_EVAL.replace("model(x)", "model.encode(x)") % ""
    add(Case("i17 evaluate: calls model.encode only", tune(), 4,
             {"m.py": model_src(build=ENCODE_MODEL, evaluate=enc_eval)}, note=mentions("forward")))
    add(Case("i17 evaluate: scores a cached torch.jit.trace", tune(), 4,
             {"m.py": model_src(build=fb.BUILD_FRAGILE, data=fb.DATA_FRAGILE, evaluate=TRACE_EVAL)}))
    add(Case("i17 evaluate: metric constant while all-low error is large", tune(), 4,
             {"m.py": model_src(build=fb.BUILD_FRAGILE, data=fb.DATA_FRAGILE, evaluate=CONST_EVAL)}))

    # --- 1/9. trials run what is deployed: containers and odd forwards -------------------------------------------
    for name, src in (("ModuleList", CONTAINER_MODEL % MODULELIST), ("ModuleDict", CONTAINER_MODEL % MODULEDICT),
                      ("a fresh nn.SiLU per call", FRESH_MODULE_MODEL), ("parametrized weight", PARAMETRIZED_BUILD),
                      ("NamedTuple between modules", NAMEDTUPLE_MODEL),
                      ("nn.TransformerEncoder (fast path)", TRANSFORMER_MODEL)):
        files = {"m.py": model_src(build=src) if "_data" not in src else model_src(build=src, data="")}
        add(Case(f"i17 deployed: {name}, check --checkpoint", ["check", f"{T}/out", "--checkpoint"], 0, files,
                 setup=tuned()))
    for name, src, island in (("ModuleList under an FP32 island", CONTAINER_MODEL % MODULELIST, "block=fp32"),
                              ("ModuleDict under an FP32 island", CONTAINER_MODEL % MODULEDICT, "block=fp32"),
                              ("NamedTuple into an FP32 module", NAMEDTUPLE_MODEL, "head=fp32")):
        add(Case(f"i17 deployed: {name} (inspect --module)", ["inspect", f"{T}/m.py", "--module", island], 0,
                 {"m.py": model_src(build=src)}))
    add(Case("i17 deployed: forward returns None (output kept on self)", tune(), 0,
             {"m.py": model_src(build="", evaluate=None, tail=NONE_FORWARD_MODEL)}))
    add(Case("i17 deployed: forward returns its input dict, --rank exact", tune(f"{T}/m.py", "--rank", "exact"), 0,
             {"m.py": model_src(build="", inputs=None, evaluate=None, tail=DICT_MODEL)}))

    # --- 8. --debug, module patterns ------------------------------------------------------------------------------
    add(Case("i17 cli: --debug after the command", tune(f"{T}/m.py", "--debug"), 0, M))
    add(Case("i17 cli: --debug after the command, evaluate raises", tune(f"{T}/m.py", "--debug"), 4,
             {"m.py": model_src(evaluate="def evaluate(model):\n    raise KeyError('labels')\n")},
             note=lambda c, r: "traceback shown" if "Traceback" in r.stderr else "NO traceback with --debug"))
    add(Case("i17 cli: --module 'nosuch.*=fp32' (inspect)", ["inspect", f"{T}/m.py", "--module", "nosuch.*=fp32"],
             2, M))
    add(Case("i17 cli: --module 'nosuch=fp32' (inspect)", ["inspect", f"{T}/m.py", "--module", "nosuch=fp32"], 2, M))
    add(Case("i17 cli: --module 'block.layers.9=fp32' past a ModuleList's end",
             ["inspect", f"{T}/m.py", "--module", "block.layers.9=fp32"], 2,
             {"m.py": model_src(build=CONTAINER_MODEL % MODULELIST)}))
    add(Case("i17 cli: --module '0=fp32' (matches: control)", ["inspect", f"{T}/m.py", "--module", "0=fp32"], 0, M))

    # --- 8. torchrun misconfiguration -------------------------------------------------------------------------------
    add(Case("i17 dist: WORLD_SIZE=2 without a launcher", tune(), 2, M,
             env={"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}, note=took))
    add(Case("i17 dist: lone rank 1, nothing at MASTER_PORT", tune(), 2, M,
             env={"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
                  "MASTER_PORT": str(free_port()), "MPT_DIST_TIMEOUT": "20"}, note=took))
    add(Case("i17 dist: lone rank 0, no rank 1 ever joins (join timeout 5 s, collectives 1800 s)", tune(), 2, M,
             env={"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                  "MASTER_PORT": str(free_port()), "MPT_DIST_TIMEOUT": "1800", "MPT_DIST_JOIN_TIMEOUT": "5"},
             note=took))

    # --- 8. out of memory -------------------------------------------------------------------------------------------
    add(Case("i17 oom: MemoryError in the first trial only (retried)", tune(), 0,
             {"m.py": model_src(build=fb.BUILD_FRAGILE, data=fb.DATA_FRAGILE,
                                evaluate=OOM_EVAL % {"when": "n == 3", "exc": "MemoryError()"})}))
    add(Case("i17 oom: MemoryError in the baseline", tune(), 2,
             {"m.py": model_src(evaluate=OOM_EVAL % {"when": "True", "exc": "MemoryError()"})}))
    add(Case("i17 oom: torch.OutOfMemoryError in every trial", tune(), 2,
             {"m.py": model_src(build=fb.BUILD_FRAGILE, data=fb.DATA_FRAGILE, evaluate=OOM_EVAL % {
                 "when": "n >= 3", "exc": "torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2 GiB')"})}))
    add(Case("i17 oom: build_model raises MemoryError", tune(), 2,
             {"m.py": model_src(build="def build_model():\n    raise MemoryError()\n")}))
    add(Case("i17 oom: CPU allocator error in forward (inspect)", ["inspect", f"{T}/m.py"], 2, {"m.py": model_src(
        inputs="def example_inputs():\n    return (_data(2, 1),)\n",
        tail="def _oom(self, x):\n    raise RuntimeError(\"[enforce fail at alloc_cpu.cpp:117] "
             "DefaultCPUAllocator: can't allocate memory: you tried to allocate 99999999999 bytes\")\n"
             "nn.Sequential.forward = _oom\n")}))

    # --- 8. threads left running ------------------------------------------------------------------------------------
    add(Case("i17 thread: evaluate leaves a non-daemon thread", tune(), 0,
             {"m.py": model_src(evaluate=THREAD_EVAL)}, note=took))
    add(Case("i17 thread: build_model leaves a non-daemon thread", tune(), 0,
             {"m.py": model_src(build=THREAD_BUILD)}, note=took))

    # --- 8. --out vanishing mid-run ---------------------------------------------------------------------------------
    slow = {"m.py": model_src(build=fb.BUILD_FRAGILE, data=fb.DATA_FRAGILE, evaluate=SLOW_EVAL)}
    add(Case("i17 out: --out deleted mid-run", tune(), 2, slow, action=after_first_eval(fb, rm_out),
             note=mentions("out")))
    add(Case("i17 out: --out replaced by a file mid-run", tune(), 2, slow, action=after_first_eval(fb, out_to_file),
             note=intact("out", "now a file\n")))
    add(Case("i17 out: journal replaced by a folder mid-run", tune(), 2, slow,
             action=after_first_eval(fb, journal_to_dir), note=mentions("journal")))

    # --- 8. jit.script and example_inputs ---------------------------------------------------------------------------
    add(Case("i17 jit: torch.jit.script root", tune(), 2, {"m.py": model_src(build=SCRIPT_ROOT_BUILD)},
             note=mentions("jit")))
    add(Case("i17 jit: torch.jit.script submodule", tune(), 2, {"m.py": model_src(build=SCRIPT_SUB_BUILD)},
             note=mentions("jit")))
    add(Case("i17 inputs: example_inputs of the wrong shape (tune)", tune(), 4, {"m.py": model_src(
        inputs="def example_inputs():\n    return (torch.randn(2, 5),)\n")}, note=mentions("example_inputs")))
    add(Case("i17 inputs: example_inputs of int64 dtype (tune)", tune(), 4, {"m.py": model_src(
        inputs="def example_inputs():\n    return (torch.ones(2, 8, dtype=torch.long),)\n")},
        note=mentions("example_inputs")))
    add(Case("i17 inputs: example_inputs made under a leaked float64 default dtype", tune(), 4, {"m.py": model_src(
        inputs="def example_inputs():\n    torch.set_default_dtype(torch.float64)\n    return (torch.randn(2, 8),)\n")},
        note=mentions("example_inputs")))
    add(Case("i17 inputs: example_inputs on the meta device (tune)", tune(), 4, {"m.py": model_src(
        inputs="def example_inputs():\n    return (torch.randn(2, 8, device='meta'),)\n")},
        note=mentions("example_inputs")))
    return C


def _set_key(text: str, key: str, value: str) -> str:
    import re

    new, n = re.subn(rf"^(\s*){key}:.*$", rf"\g<1>{key}: {value}", text, count=1, flags=re.M)
    if n == 0:
        new = text + f"{key}: {value}\n"
    return new


def _stale_staging(ctx) -> None:
    import json

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

"""Issue 34's fault classes for `benchmarks/fault_battery.py`: one table of cases, each with its expected exit code.

Imported by the battery (`cases()` appends `issue34_cases(battery)`), which passes itself in so that these cases
share its harness. Every case is named `i34 <class>: ...`, the classes in order:

- `hooks`: global module hooks of every kind torch offers (`register_module_forward_pre_hook`,
  `register_module_forward_hook` plain, `with_kwargs=True` and `always_call=True`, the full backward and backward
  pre hooks, the module/parameter/buffer registration hooks) that an `evaluate` registers and leaves behind, and
  hooks `build_model()` registers as the model's own.
- `dtypes`: float64, complex and integer parameters and buffers, bf16 and fp16 runs, each tune followed by
  `mpt check --checkpoint` on its folder.
- `fused`: torch's fused fast paths (`nn.TransformerEncoder` nesting a padded input,
  `nn.TransformerEncoderLayer`, `nn.MultiheadAttention` with need_weights=False), batch_first or not, norm_first
  or not, with and without a padding mask, bf16 and fp16, each evaluated under no_grad (the fast paths'
  condition) and tuned with `mpt check --checkpoint` after: the module outside any FP32 region with part of it
  kept FP32 by the search (a fragile input offset, 1000 + signal, its bias compensating it) or an FP32 head
  after it, and the module inside an FP32 region the model opens itself (`torch.autocast(enabled=False)`).
- `islands`: every container kind (NamedTuple, dataclass frozen or not, OrderedDict, defaultdict, deque,
  nestings of them, keyword arguments, attributes the caller sets on the island before calling it) carrying low-precision tensors into a module the plan keeps FP32 (its
  `cdist(x + 1000, p + 1000)` is fragile in bf16/fp16, so the search keeps it FP32).
- `composites`: ATen composites whose inside torch.autocast sees, not the op: nn.GRUCell, nn.LSTMCell and
  nn.RNNCell (tanh, relu) fed a lowered activation (their gate matmuls run low under torch.autocast, the cell op
  itself is on no CPU list), torch.inner of two 1-d tensors (ATen `dot`, not lowered on CPU), and torch.tensordot
  and F.bilinear given a lowered activation and an FP32 parameter; each tune followed by `mpt check --checkpoint`.
- `resume`: a tune stopped at each of its phases (the baseline, finding the candidates, the all-low trial, the
  ranking, search trial k for the first, middle and last k, the result, measuring the report, renaming the
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
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the battery imports this module: its types for the hints only
    from fault_battery import Ctx, Run

# --- model sources ---------------------------------------------------------------------------------------------------
# The test-suite's shape (tests/e2e/test_deployed.py): a 16-feature input, cosine similarity to the FP32 model.
HEADER = """\
import os, time, random, dataclasses, collections
from typing import NamedTuple
import torch
from torch import nn
import torch.nn.functional as F
HERE = os.path.dirname(os.path.abspath(__file__))
X = torch.randn(64, 16, generator=torch.Generator().manual_seed(1))
def example_inputs():
    return (X[:8],)
def evaluate(model):
    with torch.no_grad():
        out = model(X)
        ref = build_model()(X)
    return float(torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0))
"""

# --- hooks: a global hook evaluate registers is its own; one left over from an earlier evaluate must not run
# (neither in a later evaluate nor in mpt's own forwards / build_model() calls): it raises when it does.
HOOK_MODEL = """\
import os, torch
from torch import nn
X = torch.randn(64, 8, generator=torch.Generator().manual_seed(2))
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 4)
        self.register_buffer("scale", torch.ones(4))
    def forward(self, x):
        return self.b(torch.relu(self.a(x))) * self.scale
def build_model():
    torch.manual_seed(0)
    return Net().eval()
def example_inputs():
    return (X[:2],)
_TOKEN = [0]
_IN = [False]
def _hook(token):
    def hook(*args, **kwargs):
        if not _IN[0]:
            raise RuntimeError("a global hook evaluate left behind ran outside evaluate")
        if token != _TOKEN[0]:
            raise RuntimeError(f"a global hook of evaluate call {token} ran in call {_TOKEN[0]}")
        return None
    return hook
def evaluate(model):
    _IN[0] = True
    _TOKEN[0] += 1
    try:
        %(register)s
        ref = build_model()
        with torch.enable_grad():
            x = X.clone().requires_grad_()
            y = model(x)
            torch.autograd.grad(y.float().sum(), x)
        with torch.no_grad():
            r = ref(X)
        return float(torch.nn.functional.cosine_similarity(y.detach().float().flatten(), r.flatten(), dim=0))
    finally:
        _IN[0] = False
"""
MM = "torch.nn.modules.module."
HOOK_KINDS = {
    "register_module_forward_pre_hook": f"{MM}register_module_forward_pre_hook(_hook(_TOKEN[0]))",
    "register_module_forward_hook": f"{MM}register_module_forward_hook(_hook(_TOKEN[0]))",
    "register_module_forward_hook(with_kwargs=True)":
        f"{MM}register_module_forward_hook(_hook(_TOKEN[0]), with_kwargs=True)",
    "register_module_forward_hook(always_call=True)":
        f"{MM}register_module_forward_hook(_hook(_TOKEN[0]), always_call=True)",
    "register_module_full_backward_hook": f"{MM}register_module_full_backward_hook(_hook(_TOKEN[0]))",
    "register_module_full_backward_pre_hook": f"{MM}register_module_full_backward_pre_hook(_hook(_TOKEN[0]))",
    "register_module_module_registration_hook": f"{MM}register_module_module_registration_hook(_hook(_TOKEN[0]))",
    "register_module_parameter_registration_hook":
        f"{MM}register_module_parameter_registration_hook(_hook(_TOKEN[0]))",
    "register_module_buffer_registration_hook": f"{MM}register_module_buffer_registration_hook(_hook(_TOKEN[0]))",
}

# build_model() registers its hook once (the model's own: it doubles the output of every Linear), and evaluate
# leaves one of its own behind per call (a plain counter): the model's hook must run in every evaluation, the
# leftovers in none after their call.
BUILD_HOOK_MODEL = HEADER.split("def evaluate(model):")[0] + """\
_REG = []
_SEEN = [0, 0]
def _double(m, i, o):
    return o * 2.0 if isinstance(m, nn.Linear) else None
def build_model():
    if not _REG:
        _REG.append(torch.nn.modules.module.register_module_%(kind)s)
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval()
def evaluate(model):
    _SEEN[1] += 1
    call = _SEEN[1]
    def leftover(*a):
        if _SEEN[1] != call:
            raise RuntimeError(f"evaluate call {call}'s hook ran again in call {_SEEN[1]}")
    torch.nn.modules.module.register_module_forward_hook(leftover)
    with torch.no_grad():
        out = model(X)
        ref = build_model()(X)
    return float(torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0))
"""
BUILD_HOOK_KINDS = {
    "forward hook": "forward_hook(_double)",
    "forward pre hook": "forward_pre_hook(lambda m, args: tuple(a * 1.0 for a in args))",
}

# --- dtypes: tensors no plan lowers, kept bit for bit -----------------------------------------------------------------
DTYPE_MODEL = """\
class Spectral(nn.Module):
    def __init__(self):
        super().__init__()
        %(spectral)s
    def forward(self, x):
        %(spectral_fwd)s
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.spec = Spectral()
        %(own)s
        self.proto = nn.Parameter(torch.randn(4, 16))
    def forward(self, x):
        h = self.spec(self.a(x))%(use)s
        return torch.cdist(h + 1000.0, self.proto + 1000.0)
def build_model():
    torch.manual_seed(0)
    return Model().eval()
"""
NO_SPECTRAL = {"spectral": "pass", "spectral_fwd": "return x"}
C64_PARAM = {"spectral": "self.filt = nn.Parameter(torch.randn(9, dtype=torch.complex64))",
             "spectral_fwd": "return torch.fft.irfft(torch.fft.rfft(x.float(), dim=-1) * self.filt, n=16, dim=-1)"}
C64_BUFFER = {"spectral": "self.register_buffer('filt', torch.randn(9, dtype=torch.complex64))",
              "spectral_fwd": C64_PARAM["spectral_fwd"]}
C128_BUFFER = {"spectral": "self.register_buffer('filt', torch.randn(9, dtype=torch.complex128))",
               "spectral_fwd": "return torch.fft.irfft(torch.fft.rfft(x.double(), dim=-1) * self.filt, n=16, "
                               "dim=-1).float()"}
F64_BUFFER = {"own": "self.register_buffer('center', torch.randn(16, dtype=torch.float64))",
              "use": " - self.center.float()"}
F64_PARAM = {"own": "self.shift = nn.Parameter(torch.randn(16, dtype=torch.float64))", "use": " + self.shift.float()"}
F64_INT = {"own": "self.register_buffer('center', torch.randn(16, dtype=torch.float64)); "
                  "self.register_buffer('steps', torch.tensor(7))",
           "use": " - self.center.float() * (self.steps > 0)"}
NO_OWN = {"own": "pass", "use": ""}

# --- islands: containers into a module kept FP32 ------------------------------------------------------------------
ISLAND_MODEL = """\
class Pair(NamedTuple):
    h: torch.Tensor
    g: torch.Tensor
@dataclasses.dataclass
class Box:
    h: torch.Tensor
    g: torch.Tensor
@dataclasses.dataclass(frozen=True)
class Frozen:
    h: torch.Tensor
    g: torch.Tensor
class Island(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 16) / 4)
        self.proto = nn.Parameter(torch.randn(4, 16))
    def forward(self, %(params)s):
        h, g = %(unpack)s
        z = F.linear(h * g, self.w)  # the island's own FP32 op: a low input fails here
        return torch.cdist(z + 1000.0, self.proto + 1000.0)
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)
        self.island = Island()
    def forward(self, x):
        h, g = self.a(x), self.b(x)
        return self.island(%(pack)s)
def build_model():
    torch.manual_seed(0)
    return Model().eval()
"""
CONTAINERS = {
    "NamedTuple": ("p", "p.h, p.g", "Pair(h, g)"),
    "dataclass": ("p", "p.h, p.g", "Box(h, g)"),
    "frozen dataclass": ("p", "p.h, p.g", "Frozen(h, g)"),
    "OrderedDict": ("p", "p['h'], p['g']", "collections.OrderedDict(h=h, g=g)"),
    "defaultdict": ("p", "p['h'], p['g']", "collections.defaultdict(list, h=h, g=g)"),
    "deque": ("p", "p[0], p[1]", "collections.deque([h, g])"),
    "tuple of NamedTuple": ("p", "p[0].h, p[0].g", "(Pair(h, g),)"),
    "list of dict of dataclass": ("p", "p[0]['x'].h, p[0]['x'].g", "[{'x': Box(h, g)}]"),
    "dataclass holding a list of NamedTuples": ("p", "p.h[0].h, p.g", "Box([Pair(h, g)], g)"),
    "NamedTuple keyword argument": ("*, p", "p.h, p.g", "p=Pair(h, g)"),
    # attributes the caller sets on the island just before calling it (the argument is a placeholder)
    "tensors set as attributes": ("p", "self.h_, self.g_", "(setattr(self.island, 'h_', h), "
                                  "setattr(self.island, 'g_', g), None)[2]"),
    "tuple set as an attribute": ("p", "self.ctx", "(setattr(self.island, 'ctx', (h, g)), None)[1]"),
}

# --- fused: torch's fast paths. `frag`: what the search must keep FP32 (an input offset of 1000 the next bias
# cancels: bf16/fp16 rounding swamps the signal): "head" (a Linear after the module), "sa" (layer 0's
# self-attention), "sa_all" (every layer's self-attention), "ff" (layer 0's linear1). `own_fp32`: the module runs
# inside the model's own torch.autocast(enabled=False). `padded`: the metric counts the padded positions too.
FUSED_MODEL = """\
CFG = dict(kind=%(kind)r, mask=%(mask)r, norm_first=%(norm_first)r, batch_first=%(batch_first)r, frag=%(frag)r,
           own_fp32=%(own_fp32)r, padded=%(padded)r)
X = torch.randn(16, 6, 16, generator=torch.Generator().manual_seed(1))
MASK = torch.zeros(16, 6, dtype=torch.bool)
MASK[1::2, 4:] = True  # left aligned: the encoder nests its input
OFF = 1000.0
def example_inputs():
    return (X[:4],)
def _layer():
    return nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=CFG["batch_first"],
                                      norm_first=CFG["norm_first"])
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        if CFG["kind"] == "encoder":
            self.body = nn.TransformerEncoder(_layer(), 2, enable_nested_tensor=True)
        elif CFG["kind"] == "layer":
            self.body = _layer()
        else:
            self.body = nn.MultiheadAttention(16, 2, batch_first=CFG["batch_first"])
        self.head = nn.Linear(16, 16)
    def run(self, x):
        m = MASK[: x.shape[0]] if CFG["mask"] else None
        if not CFG["batch_first"]:
            x = x.transpose(0, 1)
        if CFG["kind"] == "mha":
            y = self.body(x, x, x, key_padding_mask=m, need_weights=False)[0]
        else:
            y = self.body(x, src_key_padding_mask=m)
        return y if CFG["batch_first"] else y.transpose(0, 1)
    def forward(self, x):
        if CFG["frag"] in ("sa", "sa_all") and not (CFG["kind"] != "mha" and CFG["norm_first"]):
            x = x + OFF
        if CFG["own_fp32"]:
            with torch.autocast(x.device.type, enabled=False):
                y = self.run(x.float())
        else:
            y = self.run(x)
        return self.head(y + OFF) if CFG["frag"] == "head" else self.head(y)
def _fragile(m):
    layers = [m.body] if CFG["kind"] == "layer" else list(getattr(m.body, "layers", []))
    attns = [m.body] if CFG["kind"] == "mha" else [layer.self_attn for layer in layers]
    if CFG["frag"] == "head":
        m.head.bias.sub_(OFF * m.head.weight.sum(1))
    for i, attn in enumerate(attns[:1] if CFG["frag"] == "sa" else attns if CFG["frag"] == "sa_all" else []):
        attn.in_proj_bias.sub_(OFF * attn.in_proj_weight.sum(1))
        if CFG["kind"] != "mha" and CFG["norm_first"]:
            layers[i].norm1.bias.add_(OFF)
        elif CFG["frag"] == "sa_all" and i + 1 < len(layers):
            layers[i].norm2.bias.add_(OFF)  # the next layer's input
    if CFG["frag"] == "ff":
        (layers[0].norm2 if CFG["norm_first"] else layers[0].norm1).bias.add_(OFF)
        layers[0].linear1.bias.sub_(OFF * layers[0].linear1.weight.sum(1))
def build_model():
    torch.manual_seed(0)
    m = Model()
    with torch.no_grad():
        _fragile(m)
    return m.eval()
def evaluate(model):
    with torch.no_grad():
        out = model(X)
        ref = build_model()(X)
    keep = ~MASK if CFG["mask"] and not CFG["padded"] else torch.ones_like(MASK)
    return float(F.cosine_similarity(out[keep].flatten().float(), ref[keep].flatten(), dim=0))
"""
FUSED_DEFAULTS = {"mask": True, "norm_first": False, "batch_first": True, "frag": "head", "own_fp32": False,
                  "padded": False}
# name -> (dtypes, the model's settings)
FUSED_CASES: dict[str, tuple[tuple[str, ...], dict[str, object]]] = {
    "TransformerEncoder, padding mask, every layer's self-attention kept FP32": (
        ("bf16", "fp16"), {"kind": "encoder", "frag": "sa_all"}),
    "TransformerEncoder, padding mask, layer 0's self-attention kept FP32": (("fp16",), {"kind": "encoder",
                                                                                        "frag": "sa"}),
    "TransformerEncoder, padding mask, layer 0's linear1 kept FP32": (("bf16",), {"kind": "encoder", "frag": "ff"}),
    "TransformerEncoder, padding mask, FP32 head after it": (("bf16",), {"kind": "encoder"}),
    "TransformerEncoder, padding mask, FP32 head after it, metric over the padded positions too": (
        ("bf16",), {"kind": "encoder", "padded": True}),
    "TransformerEncoder, padding mask, in the model's own FP32 region": (
        ("bf16", "fp16"), {"kind": "encoder", "own_fp32": True}),
    "TransformerEncoder, padding mask, layer 0's self-attention fragile, in the model's own FP32 region": (
        ("bf16",), {"kind": "encoder", "frag": "sa", "own_fp32": True}),
    "TransformerEncoder, no mask, in the model's own FP32 region": (
        ("bf16",), {"kind": "encoder", "mask": False, "own_fp32": True}),
    "TransformerEncoder norm_first, padding mask, in the model's own FP32 region": (
        ("bf16",), {"kind": "encoder", "norm_first": True, "own_fp32": True}),
    "TransformerEncoder batch_first=False, padding mask, in the model's own FP32 region": (
        ("bf16",), {"kind": "encoder", "batch_first": False, "own_fp32": True}),
    "TransformerEncoderLayer, padding mask, in the model's own FP32 region": (
        ("bf16",), {"kind": "layer", "own_fp32": True}),
    "TransformerEncoderLayer norm_first, no mask, in the model's own FP32 region": (
        ("bf16",), {"kind": "layer", "mask": False, "norm_first": True, "own_fp32": True}),
    "MultiheadAttention, key padding mask, in the model's own FP32 region": (
        ("bf16", "fp16"), {"kind": "mha", "own_fp32": True}),
    "MultiheadAttention, no mask, in the model's own FP32 region": (
        ("bf16",), {"kind": "mha", "mask": False, "own_fp32": True}),
    "MultiheadAttention batch_first=False, key padding mask, in the model's own FP32 region": (
        ("bf16",), {"kind": "mha", "batch_first": False, "own_fp32": True}),
}

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


# --- resume: interrupted at a phase, then --resume -------------------------------------------------------------------
# The battery's fragile MLP (fault_battery.BUILD_FRAGILE/DATA_FRAGILE) as a Sequential whose forward can stop where
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


def resume_model(kind: str, fb: ModuleType) -> str:
    """The model file of a `kind` evaluate (RESUME_NOISE)."""
    build = fb.BUILD_FRAGILE.replace("nn.Sequential(", "Net(")
    return "\n".join([RESUME_HEAD, build, fb.DATA_FRAGILE, RESUME_EVAL % {"noise": RESUME_NOISE[kind]}])


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


def _reference(fb: ModuleType, ctx: Ctx, flags: tuple[str, ...]) -> int:
    """The uninterrupted run into {T}/ref (made once per model source, then copied); its evaluate calls."""
    source = ctx.p("m.py").read_text(encoding="utf-8")
    if fb.USE_CACHE[0] and source in _REFERENCES:
        folder, calls = _REFERENCES[source]
        shutil.copytree(folder, ctx.p("ref"))
        return calls
    ctx.mpt(*fb.tune("{T}/m.py", *flags, out="{T}/ref"))
    calls = _calls(ctx)
    ctx.p("evals.log").unlink(missing_ok=True)
    keep = Path(tempfile.mkdtemp(prefix="mpt-fb-cache-"))
    shutil.copytree(ctx.p("ref"), keep / "ref")
    fb._TUNED[("i34 resume reference", source)] = keep  # removed with the battery's other copies
    _REFERENCES[source] = (keep / "ref", calls)
    return calls


def interrupted(fb: ModuleType, stop: Interrupt, flags: tuple[str, ...]) -> Callable[[Ctx], None]:
    """Setup: the uninterrupted run (ctx.facts['n']: its evaluate calls), then the run `stop` ends (its exit
    code, calls and whether plan.yaml is there in ctx.facts); stop.txt and the marker removed for --resume."""

    def signal_there(ctx: Ctx, proc: subprocess.Popen) -> None:
        if not fb.wait_for(ctx.p("inflight").exists, 90, proc):
            ctx.facts["missed"] = f"the run never got to {stop.where}"
        elif stop.sig is not None and proc.poll() is None:
            proc.send_signal(stop.sig)

    def setup(ctx: Ctx) -> None:
        ctx.facts["n"] = _reference(fb, ctx, flags)
        argv = ctx.fmt(fb.tune("{T}/m.py", *flags))
        if stop.where.startswith("renaming "):
            cmd = [fb.PY, "-c", STOP_RENAMING % {"target": stop.where.split(" ", 1)[1]}, *argv]
        else:
            ctx.write("stop.txt", f"{stop.where} {'sleep' if stop.sig is not None else 'exit'}\n")
            cmd = [fb.PY, "-m", "mpt_cli", *argv]
        first = fb.run_process(cmd, ctx.env, ctx.timeout, lambda proc: signal_there(ctx, proc))
        ctx.facts.update(first_rc=first.rc, first_calls=_calls(ctx), first_line=fb.first_line(first.stderr),
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


# --- composites: ops torch.autocast lowers inside, or not at all, whatever their Python-level name -----------------
CELL_MODEL = """\
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.cell = %(cell)s
        self.head = nn.Linear(16, 4)
    def forward(self, x):
        h = torch.zeros(x.shape[0], 16)
        %(init)s
        for t in range(3):
            %(step)s
        return self.head(h)
def build_model():
    torch.manual_seed(0)
    return Model().eval()
"""
CELLS = {
    "nn.GRUCell": {"cell": "nn.GRUCell(16, 16)", "init": "pass",
                   "step": "h = self.cell(torch.tanh(self.a(x + t)), h)"},
    "nn.LSTMCell": {"cell": "nn.LSTMCell(16, 16)", "init": "c = h",
                    "step": "h, c = self.cell(torch.tanh(self.a(x + t)), (h, c))"},
    "nn.RNNCell tanh": {"cell": "nn.RNNCell(16, 16)", "init": "pass",
                        "step": "h = self.cell(torch.tanh(self.a(x + t)), h)"},
    "nn.RNNCell relu": {"cell": "nn.RNNCell(16, 16, nonlinearity='relu')", "init": "pass",
                        "step": "h = self.cell(torch.tanh(self.a(x + t)), h)"},
}
PRODUCT_MODEL = """\
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, %(width)d)
        self.w = nn.Parameter(torch.randn(%(shape)s) / 4)
    def forward(self, x):
        h = self.a(x)
        return %(use)s
def build_model():
    torch.manual_seed(0)
    return Model().eval()
"""
PRODUCTS = {
    "torch.inner of two 1-d tensors": {
        "width": 16, "shape": "16", "use": "torch.stack([torch.inner(h[i].float(), self.w) for i in range(len(h))])"},
    "torch.tensordot of a lowered activation and an FP32 parameter": {"width": 16, "shape": "16, 4",
                                                                      "use": "torch.tensordot(h, self.w, dims=1)"},
    "F.bilinear of a lowered activation and an FP32 input": {"width": 8, "shape": "4, 8, 16",
                                                             "use": "F.bilinear(h, x, self.w)"},
}


# --- the cases --------------------------------------------------------------------------------------------------------
def issue34_cases(fb: ModuleType) -> list:
    Case, tune, T = fb.Case, fb.tune, "{T}"
    C: list = []
    add = C.append
    Q = ("--no-latency", "--tolerance", "0.001")

    def src(*parts: str) -> str:
        return "\n".join(parts)

    # --- hooks ------------------------------------------------------------------------------------------------------
    for kind, register in HOOK_KINDS.items():
        add(Case(f"i34 hooks: evaluate leaves a global {kind} behind", tune(f"{T}/m.py", "--no-latency"), 0,
                 {"m.py": HOOK_MODEL % {"register": register}}, note=loads))
    for what, reg in BUILD_HOOK_KINDS.items():
        add(Case(f"i34 hooks: build_model registers a global {what}, evaluate one per call",
                 tune(f"{T}/m.py", *Q), 0, {"m.py": BUILD_HOOK_MODEL % {"kind": reg}}, note=loads))

    # --- dtypes -----------------------------------------------------------------------------------------------------
    dtype_models = {
        "float64 buffer": {**NO_SPECTRAL, **F64_BUFFER},
        "float64 parameter": {**NO_SPECTRAL, **F64_PARAM},
        "float64 + int64 buffers": {**NO_SPECTRAL, **F64_INT},
        "complex64 parameter (FFT filter)": {**C64_PARAM, **NO_OWN},
        "complex64 buffer": {**C64_BUFFER, **NO_OWN},
        "complex128 buffer": {**C128_BUFFER, **NO_OWN},
        "complex64 + float64 + int64": {**C64_PARAM, **F64_INT},
    }
    for name, parts in dtype_models.items():
        dtypes = ("bf16", "fp16") if name in ("float64 buffer", "complex64 parameter (FFT filter)",
                                              "complex64 + float64 + int64") else ("bf16",)
        for dtype in dtypes:
            add(Case(f"i34 dtypes: {name}, {dtype}, then check --checkpoint", tune(f"{T}/m.py", "--dtype", dtype, *Q),
                     0, {"m.py": src(HEADER, DTYPE_MODEL % parts)}, cmd=[fb.PY, "-c", TUNE_CHECK],
                     shown="mpt tune ... && mpt check $TMP/out --checkpoint:", note=loads))

    # --- fused ------------------------------------------------------------------------------------------------------
    for name, (dtypes, settings) in FUSED_CASES.items():
        for dtype in dtypes:
            model = FUSED_MODEL % {**FUSED_DEFAULTS, **settings}
            add(Case(f"i34 fused: {name}, {dtype}, then check --checkpoint", tune(f"{T}/m.py", "--dtype", dtype, *Q),
                     0, {"m.py": src(HEADER.split("X = ")[0], model)}, cmd=[fb.PY, "-c", TUNE_CHECK],
                     shown="mpt tune ... && mpt check $TMP/out --checkpoint:", note=loads))

    # --- islands ----------------------------------------------------------------------------------------------------
    for name, (params, unpack, pack) in CONTAINERS.items():
        dtypes = ("bf16", "fp16") if name in ("NamedTuple", "dataclass", "tuple of NamedTuple",
                                              "tensors set as attributes") else ("bf16",)
        for dtype in dtypes:
            add(Case(f"i34 islands: {name} into an FP32 island, {dtype}", tune(f"{T}/m.py", "--dtype", dtype, *Q), 0,
                     {"m.py": src(HEADER, ISLAND_MODEL % {"params": params, "unpack": unpack, "pack": pack})},
                     note=loads))

    # --- composites --------------------------------------------------------------------------------------------------
    composites = {name: CELL_MODEL % parts for name, parts in CELLS.items()}
    composites.update({name: PRODUCT_MODEL % parts for name, parts in PRODUCTS.items()})
    for name, model in composites.items():
        for dtype in ("bf16", "fp16"):
            add(Case(f"i34 composites: {name}, {dtype}, then check --checkpoint",
                     tune(f"{T}/m.py", "--dtype", dtype, "--no-latency", "--tolerance", "1e-6"), (0, 3),
                     {"m.py": src(HEADER, model)}, cmd=[fb.PY, "-c", TUNE_CHECK],
                     shown="mpt tune ... && mpt check $TMP/out --checkpoint:", note=loads))

    # --- resume -----------------------------------------------------------------------------------------------------
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
        add(Case(f"i34 resume: {name}, then --resume", tune(f"{T}/m.py", *R, "--resume"), 0,
                 {"m.py": resume_model(kind, fb)}, setup=interrupted(fb, stop, R), note=replay_note,
                 check=replay_check(stop)))

    return C

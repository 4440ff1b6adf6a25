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
  nestings of them, keyword arguments) carrying low-precision tensors into a module the plan keeps FP32 (its
  `cdist(x + 1000, p + 1000)` is fragile in bf16/fp16, so the search keeps it FP32).
"""
from __future__ import annotations

import subprocess
import sys
from types import ModuleType

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
        dtypes = ("bf16", "fp16") if name in ("NamedTuple", "dataclass", "tuple of NamedTuple") else ("bf16",)
        for dtype in dtypes:
            add(Case(f"i34 islands: {name} into an FP32 island, {dtype}", tune(f"{T}/m.py", "--dtype", dtype, *Q), 0,
                     {"m.py": src(HEADER, ISLAND_MODEL % {"params": params, "unpack": unpack, "pack": pack})},
                     note=loads))

    return C

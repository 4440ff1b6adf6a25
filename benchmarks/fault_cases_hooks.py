"""Fault class `hooks`: global module hooks of every kind torch offers (`register_module_forward_pre_hook`,
`register_module_forward_hook` plain, `with_kwargs=True` and `always_call=True`, the full backward and backward pre
hooks, the module/parameter/buffer registration hooks) that an `evaluate` registers and leaves behind, and hooks
`build_model()` registers as the model's own. Every case expects exit 0 and the plan to load back.
"""
from __future__ import annotations

from fault_harness import Case, loads, tune
from fault_models import COSINE_HEADER, QUICK

CLASSES = ("hooks",)
T = "{T}"  # the case's temp folder, in argv

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
BUILD_HOOK_MODEL = COSINE_HEADER.split("def evaluate(model):")[0] + """\
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


def cases() -> list[Case]:
    """A global hook evaluate leaves behind, or build_model registers, of every kind."""
    C: list[Case] = []
    add = C.append
    for kind, register in HOOK_KINDS.items():
        add(Case(f"hooks: evaluate leaves a global {kind} behind", tune(f"{T}/m.py", "--no-latency"), 0,
                 {"m.py": HOOK_MODEL % {"register": register}}, note=loads))
    for what, reg in BUILD_HOOK_KINDS.items():
        add(Case(f"hooks: build_model registers a global {what}, evaluate one per call",
                 tune(f"{T}/m.py", *QUICK), 0, {"m.py": BUILD_HOOK_MODEL % {"kind": reg}}, note=loads))

    return C

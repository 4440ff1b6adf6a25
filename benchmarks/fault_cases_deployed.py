"""Fault class `deployed`: trials run what is deployed, for containers and odd forwards (ModuleList, ModuleDict, a
fresh module per call, a parametrized weight, a NamedTuple between modules, torch's TransformerEncoder fast path,
a forward that returns None or its input dict), each tuned and checked with `mpt check --checkpoint`, or an FP32
island named with `inspect --module`.
"""
from __future__ import annotations

from fault_harness import Case, tune, tuned
from fault_models import CONTAINER_MODEL, MODULEDICT, MODULELIST, model_src

CLASSES = ("deployed",)
T = "{T}"  # the case's temp folder, in argv

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


def cases() -> list[Case]:
    """Containers and odd forwards, tuned then checked, or inspected under an FP32 island."""
    C: list[Case] = []
    add = C.append
    # --- trials run what is deployed: containers and odd forwards -------------------------------------------
    for name, src in (("ModuleList", CONTAINER_MODEL % MODULELIST), ("ModuleDict", CONTAINER_MODEL % MODULEDICT),
                      ("a fresh nn.SiLU per call", FRESH_MODULE_MODEL), ("parametrized weight", PARAMETRIZED_BUILD),
                      ("NamedTuple between modules", NAMEDTUPLE_MODEL),
                      ("nn.TransformerEncoder (fast path)", TRANSFORMER_MODEL)):
        files = {"m.py": model_src(build=src) if "_data" not in src else model_src(build=src, data="")}
        add(Case(f"deployed: {name}, check --checkpoint", ["check", f"{T}/out", "--checkpoint"], 0, files,
                 setup=tuned()))
    for name, src, island in (("ModuleList under an FP32 island", CONTAINER_MODEL % MODULELIST, "block=fp32"),
                              ("ModuleDict under an FP32 island", CONTAINER_MODEL % MODULEDICT, "block=fp32"),
                              ("NamedTuple into an FP32 module", NAMEDTUPLE_MODEL, "head=fp32")):
        add(Case(f"deployed: {name} (inspect --module)", ["inspect", f"{T}/m.py", "--module", island], 0,
                 {"m.py": model_src(build=src)}))
    add(Case("deployed: forward returns None (output kept on self)", tune(), 0,
             {"m.py": model_src(build="", evaluate=None, tail=NONE_FORWARD_MODEL)}))
    add(Case("deployed: forward returns its input dict, --rank exact", tune(f"{T}/m.py", "--rank", "exact"), 0,
             {"m.py": model_src(build="", inputs=None, evaluate=None, tail=DICT_MODEL)}))

    return C

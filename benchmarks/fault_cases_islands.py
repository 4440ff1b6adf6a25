"""Fault class `islands`: every container kind (NamedTuple, dataclass frozen or not, OrderedDict, defaultdict,
deque, nestings of them, keyword arguments, attributes the caller sets on the island before calling it) carrying
low-precision tensors into a module the plan keeps FP32 (its `cdist(x + 1000, p + 1000)` is fragile in bf16/fp16,
so the search keeps it FP32). Every case expects exit 0 and the plan to load back.
"""
from __future__ import annotations

from fault_harness import Case, loads, tune
from fault_models import COSINE_HEADER, QUICK

CLASSES = ("islands",)
T = "{T}"  # the case's temp folder, in argv

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


def cases() -> list[Case]:
    """Each container kind into an FP32 island."""
    C: list[Case] = []
    add = C.append
    for name, (params, unpack, pack) in CONTAINERS.items():
        dtypes = ("bf16", "fp16") if name in ("NamedTuple", "dataclass", "tuple of NamedTuple",
                                              "tensors set as attributes") else ("bf16",)
        for dtype in dtypes:
            add(Case(f"islands: {name} into an FP32 island, {dtype}", tune(f"{T}/m.py", "--dtype", dtype, *QUICK), 0,
                     {"m.py": COSINE_HEADER + "\n" + ISLAND_MODEL % {"params": params, "unpack": unpack, "pack": pack}},
                     note=loads))

    return C

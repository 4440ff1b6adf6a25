"""Fault class `composites`: ATen composites whose inside torch.autocast sees, not the op: nn.GRUCell,
nn.LSTMCell and nn.RNNCell (tanh, relu) fed a lowered activation (their gate matmuls run low under torch.autocast,
the cell op itself is on no CPU list), torch.inner of two 1-d tensors (ATen `dot`, not lowered on CPU), and
torch.tensordot and F.bilinear given a lowered activation and an FP32 parameter; each tune followed by
`mpt check --checkpoint` (exit 0 or 3).
"""
from __future__ import annotations

from fault_harness import Case, tune_then_check
from fault_models import COSINE_HEADER

CLASSES = ("composites",)

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


def cases() -> list[Case]:
    """Each composite in bf16 and fp16, tuned then checked."""
    composites = {name: CELL_MODEL % parts for name, parts in CELLS.items()}
    composites.update({name: PRODUCT_MODEL % parts for name, parts in PRODUCTS.items()})
    return [tune_then_check(f"composites: {name}, {dtype}", ("--dtype", dtype, "--no-latency", "--tolerance", "1e-6"),
                            (0, 3), COSINE_HEADER + "\n" + model)
            for name, model in composites.items() for dtype in ("bf16", "fp16")]

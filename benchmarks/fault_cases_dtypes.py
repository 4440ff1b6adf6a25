"""Fault class `dtypes`: float64, complex and integer parameters and buffers (tensors no plan lowers, kept bit
for bit), bf16 and fp16 runs, each tune followed by `mpt check --checkpoint` on its folder.
"""
from __future__ import annotations

from fault_harness import Case, tune_then_check
from fault_models import COSINE_HEADER, QUICK

CLASSES = ("dtypes",)

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


def cases() -> list[Case]:
    """Each dtype mix, tuned in bf16 (and fp16 for three), then checked."""
    dtype_models = {
        "float64 buffer": {**NO_SPECTRAL, **F64_BUFFER},
        "float64 parameter": {**NO_SPECTRAL, **F64_PARAM},
        "float64 + int64 buffers": {**NO_SPECTRAL, **F64_INT},
        "complex64 parameter (FFT filter)": {**C64_PARAM, **NO_OWN},
        "complex64 buffer": {**C64_BUFFER, **NO_OWN},
        "complex128 buffer": {**C128_BUFFER, **NO_OWN},
        "complex64 + float64 + int64": {**C64_PARAM, **F64_INT},
    }
    both = ("float64 buffer", "complex64 parameter (FFT filter)", "complex64 + float64 + int64")
    return [tune_then_check(f"dtypes: {name}, {dtype}", ("--dtype", dtype, *QUICK), 0,
                            COSINE_HEADER + "\n" + DTYPE_MODEL % parts)
            for name, parts in dtype_models.items() for dtype in (("bf16", "fp16") if name in both else ("bf16",))]

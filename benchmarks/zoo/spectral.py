"""Zoo model: a 1-d Fourier neural operator (FNO: rfft, complex64 spectral weights, irfft); metric: cosine.

    mpt tune benchmarks/zoo/spectral.py --dtype bf16 --tolerance 1e-4 --out runs/spectral

Written here: a pointwise lift (nn.Linear 2 -> width), 4 Fourier layers, a projection (Linear width ->
128 -> 1). Each Fourier layer adds a spectral convolution and a pointwise 1x1 nn.Conv1d, then GELU:
the spectral convolution takes torch.fft.rfft of the signal, multiplies its lowest `modes`
frequencies by a complex64 nn.Parameter weight (in x out x modes, einsum "bim,iom->bom") and goes
back with torch.fft.irfft. The complex weights and the FFTs are the model's own (mpt never lowers
complex tensors); the linears and 1x1 convs are what a plan can put in bf16/fp16. Width 32, 16 modes,
grid of 128 points, 52K parameters (the complex weights counted as two reals each); seeded init.

Data: 64 fixed input functions on the grid (seeded sums of random sines, and the grid coordinate as
a second channel), 4 batches of 16. Metric: the mean cosine similarity, per function, between the
output and the FP32 model's (1.0 for the FP32 model; higher is better).

MPT_ZOO_SIZE=tiny: width 8, 4 modes, 2 Fourier layers, a grid of 32, 8 functions.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

import _shared


def config() -> dict:
    if _shared.tiny():
        return {"width": 8, "modes": 4, "layers": 2, "grid": 32, "funcs": 8, "batch": 8}
    return {"width": 32, "modes": 16, "layers": 4, "grid": 128, "funcs": 64, "batch": 16}


class SpectralConv1d(nn.Module):
    def __init__(self, cin: int, cout: int, modes: int) -> None:
        super().__init__()
        self.modes = modes
        scale = 1.0 / (cin * cout)
        self.weight = nn.Parameter(scale * torch.randn(cin, cout, modes, dtype=torch.complex64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: batch, channels, grid
        xf = torch.fft.rfft(x, dim=-1)
        out = torch.zeros(x.shape[0], self.weight.shape[1], xf.shape[-1], dtype=xf.dtype, device=x.device)
        out[..., :self.modes] = torch.einsum("bim,iom->bom", xf[..., :self.modes], self.weight)
        return torch.fft.irfft(out, n=x.shape[-1], dim=-1)


class FNO1d(nn.Module):
    def __init__(self, width: int, modes: int, layers: int) -> None:
        super().__init__()
        self.lift = nn.Linear(2, width)
        self.spectral = nn.ModuleList([SpectralConv1d(width, width, modes) for _ in range(layers)])
        self.pointwise = nn.ModuleList([nn.Conv1d(width, width, 1) for _ in range(layers)])
        self.proj1 = nn.Linear(width, 128)
        self.proj2 = nn.Linear(128, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: batch, grid, 2
        h = self.lift(x).permute(0, 2, 1)
        for spec, pw in zip(self.spectral, self.pointwise, strict=True):
            h = F.gelu(spec(h) + pw(h))
        return self.proj2(F.gelu(self.proj1(h.permute(0, 2, 1)))).squeeze(-1)


@functools.lru_cache(maxsize=2)
def _functions(n: int, grid: int) -> torch.Tensor:
    g = _shared.generator(1)
    t = torch.linspace(0, 1, grid)
    k = torch.arange(1, 9, dtype=torch.float32)
    amp = torch.randn(n, 8, generator=g) / k
    phase = 2 * math.pi * torch.rand(n, 8, generator=g)
    u = (amp[:, :, None] * torch.sin(2 * math.pi * k[None, :, None] * t[None, None, :] + phase[:, :, None])).sum(1)
    return torch.stack([u, t.expand(n, grid)], dim=-1)


def data() -> torch.Tensor:
    c = config()
    return _functions(c["funcs"], c["grid"])


def build_model() -> nn.Module:
    c = config()
    with _shared.seeded(0):
        model = FNO1d(c["width"], c["modes"], c["layers"])
    return model.eval()


def _outputs(model: nn.Module) -> list[torch.Tensor]:
    return _shared.batched(model, data(), config()["batch"])


def evaluate(model: nn.Module) -> float:
    """Mean cosine similarity of each output function to the FP32 model's."""
    ref = _shared.reference(f"spectral/{_shared.size()}", build_model, _outputs, _shared.device_of(model))
    return _shared.mean_cosine(ref, _outputs(model))


def example_inputs() -> tuple[torch.Tensor]:
    return (data()[:4].clone(),)

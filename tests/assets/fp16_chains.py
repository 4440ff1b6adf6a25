"""Test model file: fp16 overflow chains, the hazards issue 39 names, each a builder of this file.

In every model an op A produces values past float16's largest (65504) in FP32, and the op B that reads them
casts its input to fp16 itself: keeping A in FP32 is not enough, B must stay FP32 too (and nothing else must).

- `build_mlp` (default): a Linear chain; `l2` outputs ~1e5, `l3` reads it and scales it back down.
- `build_deep`: 11 Linears, each followed by gelu (21 candidates); `layers.3` outputs ~1e5 into `layers.4`.
  Before the range rule: 11 of 21 instances FP32, 11% of FLOPs in fp16, after 6 evaluations.
- `build_cnn`: a conv chain; `c1` outputs ~1e5, `c2` (most of the FLOPs) reads it.
- `build_t5`: T5-style feed-forward blocks; the last block's `wo` outputs ~1e5 into a residual and a norm.
- `build_geglu`: gelu(gate) * up reaches ~1e5 (each factor stays in range) and feeds `down_proj`.

evaluate() is the share of the 256 inputs whose argmax matches the FP32 model's (higher is better): NaN or inf
outputs agree with nothing. All models read the same inputs (256 x 16).
"""
import torch
from torch import nn
from torch.nn import functional as F

_G = torch.Generator().manual_seed(1)
_X = torch.randn(256, 16, generator=_G)


def _seeded(model: nn.Module, big: dict[str, float]) -> nn.Module:
    """Weights seeded, the named parameters scaled (an A by ~1e4, its B down by as much)."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) / max(1, p.shape[-1] if p.dim() > 1 else 1) ** 0.5)
            for prefix, scale in big.items():
                if name.startswith(prefix):
                    p.mul_(scale)
    return model.eval()


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(16 if i == 0 else 64, 64) for i in range(7)])
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = F.relu(layer(x))
        return self.head(x)


class Deep(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(16 if i == 0 else 64, 64) for i in range(10)])
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = F.gelu(layer(x))
        return self.head(x)


class Cnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c0 = nn.Conv2d(1, 8, 3, padding=1)
        self.c1 = nn.Conv2d(8, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 32, 3, padding=1)
        self.c3 = nn.Conv2d(32, 8, 3, padding=1)
        self.head = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.reshape(-1, 1, 4, 4)
        for conv in (self.c0, self.c1, self.c2, self.c3):
            h = F.relu(conv(h))
        return self.head(h.mean((2, 3)))


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wi = nn.Linear(32, 64)
        self.wo = nn.Linear(64, 32)
        self.norm = nn.LayerNorm(32)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(h + self.wo(F.relu(self.wi(h))))


class T5Like(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(16, 32)
        self.blocks = nn.ModuleList([FeedForward() for _ in range(3)])
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


class GeGlu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(32, 64)
        self.up_proj = nn.Linear(32, 64)
        self.down_proj = nn.Linear(64, 32)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.down_proj(F.gelu(self.gate_proj(h)) * self.up_proj(h))


class GeGluNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(16, 32)
        self.mlp0 = GeGlu()
        self.mlp1 = GeGlu()
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.mlp1(self.mlp0(self.embed(x))))


def build_mlp() -> nn.Module:
    return _seeded(Mlp(), {"layers.2.": 2e4, "layers.3.": 5e-5})


def build_model() -> nn.Module:
    return build_mlp()


def build_deep() -> nn.Module:
    return _seeded(Deep(), {"layers.0.weight": 300.0, "layers.3.weight": 300.0, "layers.4.weight": 1e-3})


def build_cnn() -> nn.Module:
    return _seeded(Cnn(), {"c1.": 3e3, "c2.": 3e-5})


def build_t5() -> nn.Module:
    return _seeded(T5Like(), {"blocks.2.wo.": 5e4})


def build_geglu() -> nn.Module:
    return _seeded(GeGluNet(), {"mlp1.gate_proj.": 40.0, "mlp1.up_proj.": 40.0, "mlp1.down_proj.": 1e-3})


_BUILDERS = {"Mlp": build_mlp, "Deep": build_deep, "Cnn": build_cnn, "T5Like": build_t5, "GeGluNet": build_geglu}
_REF: dict[str, torch.Tensor] = {}


def example_inputs() -> tuple:
    return (_X[:32],)


def evaluate(model: nn.Module) -> float:
    name = type(model).__name__
    if name not in _REF:
        with torch.no_grad():
            _REF[name] = _BUILDERS[name]()(_X).argmax(-1)
    with torch.no_grad():
        out = model(_X).float()
    return float((out.argmax(-1) == _REF[name]).float().mean()) if bool(out.isfinite().all()) else 0.0

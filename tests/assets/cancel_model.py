"""A model whose output is the difference of two nearly equal linears: in bf16 it is mostly rounding noise
(all-bf16 relative output error about 0.76), in FP32 it is exact. MPT_EVAL picks how evaluate reaches it:
`forward` (model(x)), `encode` (another method, never forward), `traced` (a torch.jit.trace cached by the first
call), `ignored` (calls model(x) but scores a trace cached by the first call)."""
import copy
import os
import warnings

import torch
from torch import nn

X = torch.linspace(-2, 2, 64 * 8).reshape(64, 8)
_CACHE = {}


class Cancel(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 4)
        self.b = nn.Linear(8, 4)
        with torch.no_grad():
            self.b.weight.copy_(self.a.weight + 1e-3 * torch.randn_like(self.a.weight))
            self.b.bias.copy_(self.a.bias)

    def forward(self, x):
        return self.a(x) - self.b(x)

    def encode(self, x):
        return self.a(x) - self.b(x)


def build_model():
    torch.manual_seed(0)
    return Cancel().eval()


with torch.no_grad():
    REF = build_model()(X)


def example_inputs():
    return (X,)


def _score(out):
    return 1.0 - float((out.float() - REF).norm() / REF.norm())


def evaluate(model):
    how = os.environ.get("MPT_EVAL", "forward")
    with torch.no_grad():
        if how == "encode":
            return _score(model.encode(X))
        if how in ("traced", "ignored"):
            if "trace" not in _CACHE:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.trace is deprecated in 2.13
                    # "ignored" traces a copy: its weights stay FP32 whatever a trial does to the model's
                    traced = copy.deepcopy(model) if how == "ignored" else model
                    _CACHE["trace"] = torch.jit.trace(traced, (X,), check_trace=False)
            if how == "ignored":
                model(X)
            return _score(_CACHE["trace"](X))
        return _score(model(X))

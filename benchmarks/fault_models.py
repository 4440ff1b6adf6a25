"""Model-file text the fault battery's cases write into their temp folders (no case, no harness here).

Every model is tiny and seeded; evaluate takes milliseconds unless a case makes it sleep. The battery's own MLP
(`OK`, `FRAGILE`, built by `model_src` from the blocks below) scores 1 - relative L2 error against a float64 run
of the same weights (float64 is never cast); `COSINE_HEADER` is the test suite's shape (a 16-feature input,
cosine similarity to the FP32 model), which the hooks, dtypes, fused, islands and composites classes build on.
"""
from __future__ import annotations

import textwrap

HEAD = """\
import os, time, math, random
import torch
from torch import nn
HERE = os.path.dirname(os.path.abspath(__file__))
"""

BUILD = """\
def build_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
"""

DATA = """\
def _data(n, seed):
    return torch.randn(n, 8, generator=torch.Generator().manual_seed(seed))
"""

INPUTS = """\
def example_inputs():
    return (_data(2, 1),)
"""

# Called at the start of every evaluate; slow variants replace it.
HOOK = """\
def _before():
    pass
def _after(metric):
    return metric
"""

EVAL = """\
@torch.no_grad()
def evaluate(model):
    _before()
    x = _data(64, 2)
    ref = build_model().double()(x.double())
    y = model(x).double()
    return _after(float(1.0 - (y - ref).norm() / ref.norm()))
"""

# Two op instances bf16 breaks: inputs and hidden activations carry a DC offset of 4096 that the next layer's bias
# cancels (bf16's spacing near 4096 is 32, larger than the signal). The search needs about 6 evaluations on
# it: the baseline, all-low (fail), 2 trials until one passes, then more to drop what is not needed.
BUILD_FRAGILE = """\
def build_model():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    with torch.no_grad():
        m[0].bias.copy_(-4096.0 * m[0].weight.sum(1) + 4096.0)
        m[2].bias.copy_(-4096.0 * m[2].weight.sum(1))
    return m.eval()
"""

DATA_FRAGILE = """\
def _data(n, seed):
    g = torch.Generator().manual_seed(seed)
    return 4096.0 + 16.0 * torch.rand(n, 8, generator=g)
"""

# evaluate writes its call number to evals.log beside the model file, then sleeps.
HOOK_SLOW = """\
_N = [0]
def _before():
    _N[0] += 1
    with open(os.path.join(HERE, "evals.log"), "a") as fh:
        fh.write(f"{_N[0]} {os.getpid()}\\n")
    time.sleep(%(sleep)s)
def _after(metric):
    return metric
"""

# Fast until a search trial passes (call > 2, metric near the baseline), then every later call sleeps 30 s,
# so a signal sent after the first passing trial lands inside an evaluation.
HOOK_SLOW_AFTER_PASS = """\
_N = [0]
_PASSED = [False]
def _before():
    _N[0] += 1
    if _PASSED[0]:
        time.sleep(30)
    else:
        time.sleep(0.2)
def _after(metric):
    if _N[0] > 2 and metric > 0.99:
        _PASSED[0] = True
    return metric
"""

# Seeded random noise of +-0.3% on each call (different on each call, same sequence on each run).
HOOK_NOISY = """\
_RNG = random.Random(0)
def _before():
    pass
def _after(metric):
    return metric * (1.0 + _RNG.uniform(-0.003, 0.003))
"""


def model_src(*, head: str = HEAD, build: str = BUILD, data: str = DATA, inputs: str | None = INPUTS,
              hook: str = HOOK, evaluate: str | None = EVAL, tail: str = "") -> str:
    parts = [head, build, data, hook]
    if inputs is not None:
        parts.append(inputs)
    if evaluate is not None:
        parts.append(evaluate)
    parts.append(tail)
    return "\n".join(textwrap.dedent(p) for p in parts)


OK = model_src()
FRAGILE = model_src(build=BUILD_FRAGILE, data=DATA_FRAGILE)


def slow(sleep: float, base: str = "ok") -> str:
    build, data = (BUILD_FRAGILE, DATA_FRAGILE) if base == "fragile" else (BUILD, DATA)
    return model_src(build=build, data=data, hook=HOOK_SLOW % {"sleep": sleep})


# leaks one piece of torch global state from evaluate (and still returns a good metric)
LEAK_EVAL = """\
@torch.no_grad()
def evaluate(model):
    x = _data(64, 2)
    ref = build_model().double()(x.double())
    y = model(x).double()
    %s
    return float(1.0 - (y - ref).norm() / ref.norm())
"""

CONTAINER_MODEL = """\
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.%(kind)s
    def forward(self, x):
        for layer in %(iter)s:
            x = torch.relu(layer(x))
        return x
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.block = Block()
        self.out = nn.Linear(16, 4)
    def forward(self, x):
        return self.out(self.block(self.inp(x)))
def build_model():
    torch.manual_seed(0)
    return Net().eval()
"""
MODULELIST = {"kind": "ModuleList([nn.Linear(16, 16) for _ in range(2)])", "iter": "self.layers"}
MODULEDICT = {"kind": "ModuleDict({'a': nn.Linear(16, 16), 'b': nn.Linear(16, 16)})", "iter": "self.layers.values()"}

# The test-suite's shape (tests/e2e/test_deployed.py): a 16-feature input, cosine similarity to the FP32 model.
COSINE_HEADER = """\
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

# binary garbage where a text file (plan, op list) is expected
BINARY = bytes(range(256)) * 4 + b"\x00\xff\xfe\x80linear\n\x00"


def deep_yaml(depth: int, key: str = "x") -> str:
    """A YAML document nesting `key`'s value `depth` lists deep (plans and configs refuse past 16)."""
    return "version: 1\n" + f"{key}: " + "[" * depth + "1" + "]" * depth + "\n"


# `mpt tune` flags of the cases on COSINE_HEADER models: no latency timing, a 0.1% tolerance
QUICK = ("--no-latency", "--tolerance", "0.001")

"""Fault classes of the user's model file: `control` (the harness itself works), `model` (a missing, broken or
misbehaving model file: build_model, evaluate, example_inputs), `state` (torch global state a model file or a
surrounding autocast leaves), `evaluate` (an evaluate that does not exercise the tuned forward), `jit`
(torch.jit.script models) and `inputs` (example_inputs of the wrong shape, dtype or device).
"""
from __future__ import annotations

from fault_harness import PY, Case, Ctx, Run, exists_note, mentions, tune, tuned, warned
from fault_models import BUILD_FRAGILE, DATA_FRAGILE, LEAK_EVAL, OK, model_src

CLASSES = ("control", "model", "state", "evaluate", "jit", "inputs")
T = "{T}"  # the case's temp folder, in argv
M = {"m.py": OK}  # the battery's MLP: the files of most cases

BUILD_BF16 = ("def build_model():\n    torch.manual_seed(0)\n"
              "    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval().to(%s)\n")


ENCODE_MODEL = """\
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    def forward(self, x):
        return self.body(x)
    def encode(self, x):
        with torch.autocast("cpu", enabled=False):
            return self.body.float()(x.float())
def build_model():
    torch.manual_seed(0)
    return Net().eval()
"""

# a cached trace of the FP32 model: evaluate never runs the tuned forward
TRACE_EVAL = """\
_CACHE = {}
@torch.no_grad()
def evaluate(model):
    x = _data(64, 2)
    if "t" not in _CACHE:
        _CACHE["t"] = torch.jit.trace(build_model(), (x,))
    ref = build_model().double()(x.double())
    y = _CACHE["t"](x).double()
    model(x[:1])  # calls forward once, but the metric ignores it
    return float(1.0 - (y - ref).norm() / ref.norm())
"""

CONST_EVAL = "@torch.no_grad()\ndef evaluate(model):\n    model(_data(64, 2))\n    return 0.9\n"

SCRIPT_ROOT_BUILD = """\
def build_model():
    torch.manual_seed(0)
    return torch.jit.script(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval())
"""

SCRIPT_SUB_BUILD = """\
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.jit.script(nn.Linear(8, 16))
        self.b = nn.Linear(16, 4)
    def forward(self, x):
        return self.b(torch.relu(self.a(x)))
def build_model():
    torch.manual_seed(0)
    return Net().eval()
"""

AUTOCAST_WRAPPER = """\
import sys, torch
sys.argv[0] = 'mpt'
from mpt_cli.main import main
with torch.autocast('cpu', dtype=torch.bfloat16):
    main(prog_name='mpt')
"""


def rc_note(ctx: Ctx, run: Run) -> str:
    return (f"outputs: {exists_note(ctx, 'out/plan.yaml')}, {exists_note(ctx, 'out/journal.jsonl')}; "
            f"stdout+stderr {len((run.stdout + run.stderr).strip())} chars")


def cases() -> list[Case]:
    return [*_model(), *_state(), *_evaluate(), *_inputs()]


def _model() -> list[Case]:
    """Controls, then model files that are missing, broken, or misbehave."""
    C: list[Case] = []
    add = C.append
    # --- controls: the harness itself works -----------------------------------------------------------------------
    add(Case("control: tune a good model", tune(), 0, M))
    add(Case("control: check a fresh plan", ["check", f"{T}/out"], 0, M, setup=tuned()))

    # --- model file --------------------------------------------------------------------------------------------------
    add(Case("model: missing file", tune(f"{T}/nosuch.py"), 2))
    add(Case("model: a directory", tune(f"{T}/dir.py"), 2, setup=lambda c: c.p("dir.py").mkdir()))
    add(Case("model: not a .py file", tune(f"{T}/m.txt"), 2, {"m.txt": OK}))
    add(Case("model: syntax error", tune(), 4, {"m.py": OK + "\ndef broken(:\n    pass\n"}))
    add(Case("model: import raises", tune(), 4, {"m.py": OK + "\nraise RuntimeError('no data at import')\n"}))
    renamed = OK.replace("def build_model(", "def make_model(").replace("ref = build_model()", "ref = make_model()")
    add(Case("model: no build_model", tune(), 2, {"m.py": renamed}))
    add(Case("model: build_model raises", tune(), 4,
             {"m.py": model_src(build="def build_model():\n    raise ValueError('weights not found')\n")}))
    add(Case("model: build_model returns None", tune(), 4,
             {"m.py": model_src(build="def build_model():\n    torch.manual_seed(0)\n    return None\n")}))
    add(Case("model: build_model on the meta device", tune(), 4, {"m.py": model_src(build="""\
def build_model():
    torch.manual_seed(0)
    with torch.device("meta"):
        return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
""")}))
    add(Case("model: evaluate raises", tune(), 4, {"m.py": model_src(evaluate="""\
def evaluate(model):
    raise KeyError('labels')
""")}))
    add(Case("model: evaluate returns None", tune(), 4,
             {"m.py": model_src(evaluate="def evaluate(model):\n    model(_data(4, 2))\n")}))
    add(Case("model: evaluate returns a string", tune(), 4,
             {"m.py": model_src(evaluate="def evaluate(model):\n    return 'accuracy 0.9'\n")}))
    add(Case("model: evaluate returns NaN (baseline)", tune(), 4,
             {"m.py": model_src(evaluate="def evaluate(model):\n    return float('nan')\n")}))
    add(Case("model: example_inputs raises (inspect)", ["inspect", f"{T}/m.py"], 4,
             {"m.py": model_src(inputs="def example_inputs():\n    raise OSError('sample file missing')\n")}))
    add(Case("model: example_inputs returns a list of batches (inspect: the first is the example)",
             ["inspect", f"{T}/m.py"], 0,
             {"m.py": model_src(inputs="def example_inputs():\n    return [_data(2, 1)]\n")}))
    add(Case("model: example_inputs returns a list inside the list (inspect)", ["inspect", f"{T}/m.py"], 4,
             {"m.py": model_src(inputs="def example_inputs():\n    return [[_data(2, 1)]]\n")}))
    wrong_shape = {"m.py": model_src(inputs="def example_inputs():\n    return (torch.randn(2, 5),)\n")}
    add(Case("model: forward raises on example_inputs (inspect)", ["inspect", f"{T}/m.py"], 4, wrong_shape))
    add(Case("model: forward raises on example_inputs (tune)", tune(), 4, wrong_shape))
    add(Case("model: --eval nosuch", tune(f"{T}/m.py", "--eval", "nosuch"), 2, M))
    add(Case("model: --eval other.py:fn, other.py missing", tune(f"{T}/m.py", "--eval", f"{T}/other.py:fn"), 2, M))
    add(Case("model: NUL bytes in the file", tune(), 2, {"m.py": OK.encode() + b"\n# \x00\x00\x00\n"}))
    add(Case("model: evaluate calls sys.exit(0)", tune(), 4,
             {"m.py": model_src(evaluate="def evaluate(model):\n    import sys\n    sys.exit(0)\n")}, note=rc_note))
    add(Case("model: build_model calls sys.exit(3)", tune(), 4,
             {"m.py": model_src(build="def build_model():\n    import sys\n    sys.exit(3)\n")}, note=rc_note))
    add(Case("model: evaluate returns inf (baseline)", tune(), 4,
             {"m.py": model_src(evaluate="def evaluate(model):\n    return float('inf')\n")}))
    add(Case("model: evaluate returns a 0-d tensor", tune(), 0, {"m.py": OK.replace(
        "return _after(float(1.0 - (y - ref).norm() / ref.norm()))",
        "return (1.0 - (y - ref).norm() / ref.norm()).float()")}))
    add(Case("model: evaluate trains the model, build_model unseeded", tune(), 4, {"m.py": model_src(
        build="def build_model():\n    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()\n",
        evaluate="""\
@torch.no_grad()
def evaluate(model):
    for p in model.parameters():
        p.add_(0.01)
    return float(model(_data(8, 2)).abs().mean())
""")}))
    return C


def _state() -> list[Case]:
    """Torch global state the model file changes, or a surrounding autocast."""
    C: list[Case] = []
    add = C.append
    # --- global state -------------------------------------------------------------------------------------------
    add(Case("state: build_model returns bf16", tune(), 4,
             {"m.py": model_src(build=BUILD_BF16 % "torch.bfloat16")}))
    add(Case("state: build_model returns fp16", tune(), 4, {"m.py": model_src(build=BUILD_BF16 % "torch.float16")}))
    add(Case("state: build_model returns float64", tune(), 4,
             {"m.py": model_src(build=BUILD_BF16 % "torch.float64")}))
    add(Case("state: tune inside an open torch.autocast", tune(), 2, M, cmd=[PY, "-c", AUTOCAST_WRAPPER],
             shown="python -c '<with torch.autocast(cpu): mpt_cli.main.main()>'"))
    for what, code in (("default dtype float64", "torch.set_default_dtype(torch.float64)"),
                       ("grad mode off", "torch.set_grad_enabled(False)"),
                       ("an open autocast", "torch.autocast('cpu', dtype=torch.bfloat16).__enter__()"),
                       ("thread count 1", "torch.set_num_threads(1)")):
        leak = LEAK_EVAL.replace("@torch.no_grad()\n", "") if "grad" in code else LEAK_EVAL  # no_grad() restores it
        add(Case(f"state: evaluate leaks {what}", tune(), 0, {"m.py": model_src(evaluate=leak % code)},
                 note=warned("evaluate")))
    add(Case("state: example_inputs leaks default dtype float64", tune(), 0, {"m.py": model_src(
        inputs="def example_inputs():\n    torch.set_default_dtype(torch.float64)\n"
               "    return (_data(2, 1).float(),)\n")},
        note=warned("example_inputs")))
    add(Case("state: default dtype float64 set at import", tune(), 4,
             {"m.py": OK + "\ntorch.set_default_dtype(torch.float64)\n"}))

    return C


def _evaluate() -> list[Case]:
    """An evaluate that does not exercise what is tuned."""
    C: list[Case] = []
    add = C.append
    # --- evaluate must exercise what is tuned ----------------------------------------------------------------------
    enc_eval = LEAK_EVAL.replace("model(x)", "model.encode(x)") % ""
    add(Case("evaluate: calls model.encode only", tune(), 4,
             {"m.py": model_src(build=ENCODE_MODEL, evaluate=enc_eval)}, note=mentions("forward")))
    add(Case("evaluate: scores a cached torch.jit.trace", tune(), 4,
             {"m.py": model_src(build=BUILD_FRAGILE, data=DATA_FRAGILE, evaluate=TRACE_EVAL)}))
    add(Case("evaluate: metric constant while all-low error is large", tune(), 4,
             {"m.py": model_src(build=BUILD_FRAGILE, data=DATA_FRAGILE, evaluate=CONST_EVAL)}))

    return C


def _inputs() -> list[Case]:
    """torch.jit.script models, example_inputs problems."""
    C: list[Case] = []
    add = C.append
    # --- jit.script and example_inputs ---------------------------------------------------------------------------
    add(Case("jit: torch.jit.script root", tune(), 2, {"m.py": model_src(build=SCRIPT_ROOT_BUILD)},
             note=mentions("jit")))
    add(Case("jit: torch.jit.script submodule", tune(), 2, {"m.py": model_src(build=SCRIPT_SUB_BUILD)},
             note=mentions("jit")))
    add(Case("inputs: example_inputs of the wrong shape (tune)", tune(), 4, {"m.py": model_src(
        inputs="def example_inputs():\n    return (torch.randn(2, 5),)\n")}, note=mentions("example_inputs")))
    add(Case("inputs: example_inputs of int64 dtype (tune)", tune(), 4, {"m.py": model_src(
        inputs="def example_inputs():\n    return (torch.ones(2, 8, dtype=torch.long),)\n")},
        note=mentions("example_inputs")))
    add(Case("inputs: example_inputs made under a leaked float64 default dtype", tune(), 4, {"m.py": model_src(
        inputs="def example_inputs():\n    torch.set_default_dtype(torch.float64)\n    return (torch.randn(2, 8),)\n")},
        note=mentions("example_inputs")))
    add(Case("inputs: example_inputs on the meta device (tune)", tune(), 4, {"m.py": model_src(
        inputs="def example_inputs():\n    return (torch.randn(2, 8, device='meta'),)\n")},
        note=mentions("example_inputs")))
    return C

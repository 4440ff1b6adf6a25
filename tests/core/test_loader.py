"""tuner.core.loader: importing the user's model file, picking its functions, and turning its failures into one-liners."""
from __future__ import annotations

import math
import pickle
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import torch

from tuner.core.errors import ConfigError, UserCodeError
from tuner.core.inputs import ModelInputs
from tuner.core.loader import UserModel, _split_spec, call_user, load_user_model

ASSETS = Path(__file__).parents[1] / "assets" / "loader"

TINY = """\
import torch
from torch import nn


def build_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))


def evaluate(model):
    with torch.no_grad():
        return float(model(torch.ones(2, 4)).sum())


def helper():
    return 1
"""


def write(folder: Path, name: str, source: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(source))
    return path


def line_of(path: Path, marker: str) -> int:
    """1-based line number of the first line of `path` containing `marker`."""
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if marker in line:
            return i
    raise AssertionError(f"{marker!r} not in {path}")


def one_line(exc: BaseException) -> str:
    msg = str(exc)
    assert "\n" not in msg, msg
    return msg


# --- happy path ----------------------------------------------------------------------------------------------

def test_loads_asset_model_file():
    user = load_user_model(str(ASSETS / "tiny_model.py"))
    assert isinstance(user, UserModel)
    assert user.path == (ASSETS / "tiny_model.py").resolve()
    model = user.build()
    assert isinstance(model, torch.nn.Module)
    metric = user.evaluate(model)
    assert isinstance(metric, float) and 0.0 <= metric <= 1.0
    inputs = user.example_inputs()
    assert isinstance(inputs, ModelInputs) and len(inputs.args) == 1 and inputs.args[0].shape == (3, 4)
    assert not inputs.kwargs
    inputs.call(model)


def test_user_model_is_frozen(tmp_path):
    user = load_user_model(str(write(tmp_path, "model.py", TINY)))
    with pytest.raises(Exception):
        user.path = tmp_path  # type: ignore[misc]


def test_module_registered_under_unique_name_and_sys_path_restored(tmp_path):
    path = write(tmp_path, "model.py", TINY)
    before = list(sys.path)
    a = load_user_model(str(path))
    b = load_user_model(str(path))
    assert sys.path == before
    mod_a, mod_b = a.build_fn.__module__, b.build_fn.__module__
    assert mod_a != mod_b
    assert sys.modules[mod_a].build_model is a.build_fn
    assert mod_a not in ("model", "__main__")


def test_main_guard_does_not_run(tmp_path):
    path = write(tmp_path, "model.py", TINY + "\nif __name__ == '__main__':\n    raise SystemExit('ran as main')\n")
    load_user_model(str(path))


def test_sibling_import_and_dataclass_pickling(tmp_path):
    sibling = f"sib_{uuid.uuid4().hex[:8]}"
    write(tmp_path, f"{sibling}.py", "SCALE = 3.0\n")
    path = write(tmp_path, "model.py", TINY + f"""
import dataclasses
from {sibling} import SCALE


@dataclasses.dataclass
class Box:
    value: float


def boxed():
    return Box(SCALE)
""")
    user = load_user_model(str(path))
    assert str(tmp_path) not in sys.path  # only during the import
    boxed = sys.modules[user.build_fn.__module__].boxed()
    assert boxed.value == 3.0
    assert pickle.loads(pickle.dumps(boxed)) == boxed


def test_relative_path_from_cwd(tmp_path, monkeypatch):
    write(tmp_path, "model.py", TINY)
    monkeypatch.chdir(tmp_path)
    user = load_user_model("model.py")
    assert user.path == (tmp_path / "model.py").resolve()


# --- picking functions ---------------------------------------------------------------------------------------

def test_spec_with_function_name(tmp_path):
    path = write(tmp_path, "model.py", TINY + "\n\ndef make_net():\n    return torch.nn.Linear(2, 2)\n")
    model = load_user_model(f"{path}:make_net").build()
    assert isinstance(model, torch.nn.Linear) and model.in_features == 2


def test_overrides_in_same_file(tmp_path):
    path = write(tmp_path, "model.py", TINY + """

def make_net():
    return torch.nn.Linear(2, 2)


def score(model):
    return 7


def inputs():
    return (torch.zeros(1, 2),)
""")
    user = load_user_model(str(path), model="make_net", eval="score", inputs="inputs")
    assert user.build_fn.__name__ == "make_net"
    assert user.evaluate(user.build()) == 7.0
    assert user.example_inputs().args[0].shape == (1, 2)


def test_overrides_from_another_file(tmp_path, monkeypatch):
    path = write(tmp_path, "model.py", TINY)
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    write(other_dir, "metrics.py", """\
        import torch


        def accuracy(model):
            return torch.tensor(0.25)


        def example_inputs():
            return torch.ones(5, 4)
        """)
    user = load_user_model(str(path), eval=f"{other_dir / 'metrics.py'}:accuracy",
                           inputs=str(other_dir / "metrics.py"))
    assert user.evaluate(user.build()) == 0.25
    assert user.example_inputs().args[0].shape == (5, 4)
    assert user.eval_fn.__module__ == user.inputs_fn.__module__  # the other file is imported once
    assert user.eval_fn.__module__ != user.build_fn.__module__

    # a relative FILE.py:NAME is found from the working directory, or else next to the model file
    monkeypatch.chdir(other_dir)
    assert load_user_model(str(path), eval="metrics.py:accuracy").evaluate(None) == 0.25
    write(tmp_path, "near.py", "def acc(model):\n    return 0.5\n")
    assert load_user_model(str(path), eval="near.py:acc").evaluate(None) == 0.5


def test_defaults_optional_unless_named(tmp_path):
    path = write(tmp_path, "model.py", TINY)
    user = load_user_model(str(path))
    assert user.inputs_fn is None and user.example_inputs() is None
    with pytest.raises(ConfigError) as info:
        load_user_model(str(path), inputs="make_inputs")
    assert "no function 'make_inputs'" in one_line(info.value)


def test_require_eval(tmp_path):
    path = write(tmp_path, "model.py", "import torch\n\ndef build_model():\n    return torch.nn.Linear(1, 1)\n")
    with pytest.raises(ConfigError) as info:
        load_user_model(str(path))
    assert one_line(info.value) == "model.py has no function 'evaluate'; found: build_model"
    user = load_user_model(str(path), require_eval=False)
    assert user.eval_fn is None
    with pytest.raises(ConfigError):
        user.evaluate(user.build())


def test_build_name_given_twice_conflicts(tmp_path):
    path = write(tmp_path, "model.py", TINY)
    with pytest.raises(ConfigError) as info:
        load_user_model(f"{path}:build_model", model="helper")
    assert "twice" in one_line(info.value)
    load_user_model(f"{path}:build_model", model="build_model")  # the same name twice is fine


@pytest.mark.parametrize("spec, expected", [
    ("model.py", ("model.py", None)),
    ("dir/model.py:make_net", ("dir/model.py", "make_net")),
    ("C:\\work\\model.py", ("C:\\work\\model.py", None)),
    ("C:\\work\\model.py:make_net", ("C:\\work\\model.py", "make_net")),
])
def test_split_spec(spec, expected):
    assert _split_spec(spec) == expected


def test_split_spec_rejects_bad_name():
    with pytest.raises(ConfigError) as info:
        _split_spec("model.py:build-model")
    assert "not a valid function name" in one_line(info.value)


# --- errors finding the code (ConfigError) -------------------------------------------------------------------

def test_missing_file(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_user_model(str(tmp_path / "nope.py"))
    assert one_line(info.value) == f"model file not found: {tmp_path / 'nope.py'}"


def test_missing_override_file(tmp_path):
    path = write(tmp_path, "model.py", TINY)
    with pytest.raises(ConfigError) as info:
        load_user_model(str(path), eval="absent.py:acc")
    assert "not found: absent.py" in one_line(info.value)


def test_not_a_py_file(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text("a: 1\n")
    with pytest.raises(ConfigError) as info:
        load_user_model(str(path))
    assert ".py" in one_line(info.value) and "model.yaml" in str(info.value)


def test_directory(tmp_path):
    folder = tmp_path / "model.py"
    folder.mkdir()
    with pytest.raises(ConfigError) as info:
        load_user_model(str(folder))
    assert "directory" in one_line(info.value)


def test_binary_file(tmp_path):
    path = tmp_path / "model.py"
    path.write_bytes(b"\x7fELF\x00\x01\x02")
    with pytest.raises(ConfigError) as info:
        load_user_model(str(path))
    assert "not Python" in one_line(info.value)


def test_missing_function_lists_what_the_file_defines(tmp_path):
    path = write(tmp_path, "model.py", """\
        import torch
        from torch import nn


        def evaluate(model):
            return 1.0


        def helper():
            return 2


        def _private():
            return 3
        """)
    with pytest.raises(ConfigError) as info:
        load_user_model(str(path))
    assert one_line(info.value) == "model.py has no function 'build_model'; found: evaluate, helper"


def test_missing_function_in_empty_file(tmp_path):
    path = write(tmp_path, "model.py", "X = 1\n")
    with pytest.raises(ConfigError) as info:
        load_user_model(str(path))
    assert one_line(info.value) == "model.py has no function 'build_model'; found: no functions"


def test_name_not_callable(tmp_path):
    path = write(tmp_path, "model.py", TINY + "\nbuild_net = 42\n")
    with pytest.raises(ConfigError) as info:
        load_user_model(f"{path}:build_net")
    msg = one_line(info.value)
    assert "'build_net'" in msg and "not a function" in msg and "int" in msg


# --- errors in the user's code (UserCodeError) ----------------------------------------------------------------

def test_syntax_error_names_file_and_line(tmp_path):
    path = write(tmp_path, "model.py", "import torch\n\ndef build_model(:\n    pass\n")
    with pytest.raises(UserCodeError) as info:
        load_user_model(str(path))
    msg = one_line(info.value)
    assert "model.py is not valid Python" in msg
    assert info.value.where == "model.py:3"
    assert isinstance(info.value.original, SyntaxError)


def test_syntax_error_in_sibling(tmp_path):
    sibling = f"sib_{uuid.uuid4().hex[:8]}"
    write(tmp_path, f"{sibling}.py", "x = 1\ny = (\n")
    path = write(tmp_path, "model.py", f"import {sibling}\n" + TINY)
    with pytest.raises(UserCodeError) as info:
        load_user_model(str(path))
    assert info.value.where is not None and info.value.where.startswith(f"{sibling}.py:")
    assert "importing model.py" in one_line(info.value)


def test_raise_on_import(tmp_path):
    path = write(tmp_path, "model.py", TINY + "\nraise ValueError('no data directory')  # BOOM\n")
    before = set(sys.modules)
    with pytest.raises(UserCodeError) as info:
        load_user_model(str(path))
    line = line_of(path, "# BOOM")
    assert info.value.where == f"model.py:{line}"
    assert one_line(info.value) == f"importing model.py raised ValueError: no data directory (model.py:{line})"
    assert isinstance(info.value.original, ValueError)
    assert str(tmp_path) not in sys.path
    assert not [m for m in set(sys.modules) - before if m.startswith("_mpt_user_")]


def test_torch_error_on_import_points_at_user_line(tmp_path):
    path = write(tmp_path, "model.py", TINY + "\nW = torch.ones(2, 3) @ torch.ones(4, 5)  # BAD\n")
    with pytest.raises(UserCodeError) as info:
        load_user_model(str(path))
    assert info.value.where == f"model.py:{line_of(path, '# BAD')}"
    assert "RuntimeError" in one_line(info.value)


def test_build_raises(tmp_path):
    path = write(tmp_path, "model.py", TINY + """

def broken():
    layer = torch.nn.Linear(4, 4)
    raise KeyError("weights")  # HERE
""")
    user = load_user_model(f"{path}:broken")
    with pytest.raises(UserCodeError) as info:
        user.build()
    line = line_of(path, "# HERE")
    assert one_line(info.value) == f"broken raised KeyError: 'weights' (model.py:{line})"
    assert isinstance(info.value.original, KeyError)


def test_build_returns_non_module(tmp_path):
    path = write(tmp_path, "model.py", TINY + "\n\ndef state():\n    return {'w': torch.ones(1)}\n")
    with pytest.raises(UserCodeError) as info:
        load_user_model(f"{path}:state").build()
    msg = one_line(info.value)
    assert msg.startswith("state returned dict") and "expected a torch.nn.Module" in msg


def test_where_is_innermost_user_frame_not_torch():
    path = ASSETS / "wrong_shape.py"
    user = load_user_model(str(path))
    with pytest.raises(UserCodeError) as info:
        user.evaluate(user.build())
    assert info.value.where == f"wrong_shape.py:{line_of(path, '# FORWARD')}"
    assert one_line(info.value).startswith("evaluate raised RuntimeError: ")


def test_where_in_eval_from_another_file(tmp_path):
    path = write(tmp_path, "model.py", TINY)
    metrics = write(tmp_path, "metrics.py", "def acc(model):\n    return 1 / 0  # DIV\n")
    user = load_user_model(str(path), eval=f"{metrics}:acc")
    with pytest.raises(UserCodeError) as info:
        user.evaluate(user.build())
    assert info.value.where == f"metrics.py:{line_of(metrics, '# DIV')}"
    assert "acc raised ZeroDivisionError" in one_line(info.value)


def test_call_user_one_line_message_and_pass_through(tmp_path):
    path = write(tmp_path, "model.py", TINY + """

def multi():
    raise RuntimeError("first line\\nsecond line\\nthird")


def interrupt():
    raise KeyboardInterrupt


def leave():
    raise SystemExit(3)


def nested():
    from tuner.core.errors import UserCodeError
    raise UserCodeError("already explained", where="x.py:1")


def silent():
    raise ValueError()
""")
    module = sys.modules[load_user_model(str(path)).build_fn.__module__]
    with pytest.raises(UserCodeError) as info:
        call_user(module.multi, what="multi")
    assert one_line(info.value).startswith("multi raised RuntimeError: first line")
    with pytest.raises(KeyboardInterrupt):
        call_user(module.interrupt, what="interrupt")
    with pytest.raises(UserCodeError, match=r"leave called sys.exit\(3\) \(model.py:\d+\)"):
        call_user(module.leave, what="leave")  # not mpt's exit code: the user's code ended early
    with pytest.raises(UserCodeError) as info:
        call_user(module.nested, what="nested")
    assert str(info.value) == "already explained (x.py:1)"
    with pytest.raises(UserCodeError) as info:
        call_user(module.silent, what="silent")
    assert one_line(info.value) == f"silent raised ValueError (model.py:{line_of(path, 'raise ValueError()')})"


def test_call_user_passes_args_and_returns():
    assert call_user(lambda a, *, b: a + b, 1, b=2, what="add") == 3


# --- evaluate conversions ------------------------------------------------------------------------------------

def eval_user(tmp_path: Path, body: str) -> UserModel:
    source = TINY.replace("def evaluate(model):", "def evaluate_old(model):")
    path = write(tmp_path, "model.py", source + f"\n\ndef evaluate(model):\n    return {body}\n")
    return load_user_model(str(path))


@pytest.mark.parametrize("body, expected", [
    ("0.75", 0.75),
    ("3", 3.0),
    ("torch.tensor(0.5)", 0.5),
    ("torch.tensor([0.25])", 0.25),
    ("torch.tensor([[2]])", 2.0),
    ("torch.tensor(0.5, requires_grad=True) * 2", 1.0),
    ("torch.tensor(1.5, dtype=torch.float16)", 1.5),
])
def test_evaluate_converts_numbers(tmp_path, body, expected):
    metric = eval_user(tmp_path, body).evaluate(None)
    assert type(metric) is float and metric == expected


@pytest.mark.parametrize("body", ["numpy.float32(0.5)", "numpy.float64(0.5)", "numpy.int64(0)", "numpy.array(0.5)"])
def test_evaluate_converts_numpy(tmp_path, body):
    numpy = pytest.importorskip("numpy")
    user = eval_user(tmp_path, body.replace("numpy.", "__import__('numpy')."))
    metric = user.evaluate(None)
    assert type(metric) is float and metric == float(eval(body, {"numpy": numpy}))


@pytest.mark.parametrize("body, expected", [
    ("float('nan')", "nan"),
    ("torch.tensor(float('nan'))", "nan"),
    ("float('inf')", "inf"),
    ("-torch.tensor(float('inf'))", "-inf"),
])
def test_evaluate_returns_nonfinite_as_float(tmp_path, body, expected):
    metric = eval_user(tmp_path, body).evaluate(None)
    assert type(metric) is float
    assert math.isnan(metric) if expected == "nan" else metric == float(expected)


@pytest.mark.parametrize("body, fragment", [
    ("'abc'", "evaluate returned str ('abc')"),
    ("torch.tensor([0.1, 0.2])", "a tensor with 2 elements"),
    ("torch.zeros(0)", "a tensor with 0 elements"),
    ("None", "evaluate returned None"),
    ("True", "bool"),
    ("[0.5]", "list"),
    ("{'acc': 0.5}", "dict"),
    ("1 + 2j", "complex"),
])
def test_evaluate_rejects_non_numbers(tmp_path, body, fragment):
    user = eval_user(tmp_path, body)
    with pytest.raises(UserCodeError) as info:
        user.evaluate(None)
    msg = one_line(info.value)
    assert fragment in msg and "expected a single number" in msg
    assert info.value.where == f"model.py:{line_of(user.path, 'def evaluate(model):')}"


def test_evaluate_rejects_numpy_array(tmp_path):
    pytest.importorskip("numpy")
    user = eval_user(tmp_path, "__import__('numpy').zeros(3)")
    with pytest.raises(UserCodeError) as info:
        user.evaluate(None)
    assert "3 elements" in one_line(info.value)


# --- example_inputs wrapping ---------------------------------------------------------------------------------

def inputs_user(tmp_path: Path, body: str) -> UserModel:
    path = write(tmp_path, "model.py", TINY + f"\n\ndef example_inputs():\n    return {body}\n")
    return load_user_model(str(path))


def test_inputs_tuple_kept(tmp_path):
    inputs = inputs_user(tmp_path, "(torch.ones(2), 3, None)").example_inputs()
    assert isinstance(inputs, ModelInputs) and not inputs.kwargs
    assert len(inputs.args) == 3 and inputs.args[1] == 3 and inputs.args[2] is None


def test_inputs_tensor_wrapped(tmp_path):
    inputs = inputs_user(tmp_path, "torch.ones(2, 4)").example_inputs()
    assert len(inputs.args) == 1 and inputs.args[0].shape == (2, 4) and not inputs.kwargs


def test_inputs_dict_is_keyword_args(tmp_path):
    inputs = inputs_user(tmp_path, "{'x': torch.ones(2)}").example_inputs()
    assert inputs.args == () and list(inputs.kwargs) == ["x"]


def test_inputs_dict_inside_tuple_passed_as_is(tmp_path):
    inputs = inputs_user(tmp_path, "(torch.ones(2), {'mask': torch.zeros(2)})").example_inputs()
    assert len(inputs.args) == 2 and isinstance(inputs.args[1], dict) and list(inputs.args[1]) == ["mask"]


def test_inputs_dict_with_non_str_keys_is_refused(tmp_path):
    user = inputs_user(tmp_path, "{0: torch.ones(2)}")
    with pytest.raises(UserCodeError) as info:
        user.example_inputs()
    assert "keyword argument names" in one_line(info.value)


@pytest.mark.parametrize("body, fragment", [("[[torch.ones(2)]]", "list"), ("None", "None"), ("5", "int")])
def test_inputs_rejects_other_types(tmp_path, body, fragment):  # a list is batches: a list inside one is not a batch
    with pytest.raises(UserCodeError) as info:
        inputs_user(tmp_path, body).example_inputs()
    msg = one_line(info.value)
    assert f"example_inputs returned {fragment}" in msg and "expected a tuple" in msg


def test_inputs_as_a_list_of_batches_give_the_first_as_the_example(tmp_path):
    inputs = inputs_user(tmp_path, "[(torch.ones(2),), (torch.zeros(3),)]").example_inputs()
    assert inputs.args[0].shape == (2,)


def test_inputs_raising(tmp_path):
    user = inputs_user(tmp_path, "torch.load('missing.pt')")
    with pytest.raises(UserCodeError) as info:
        user.example_inputs()
    assert info.value.where == f"model.py:{line_of(user.path, 'torch.load(')}"
    assert one_line(info.value).startswith("example_inputs raised FileNotFoundError")


# --- the user's files a model file imports -------------------------------------------------------------------
def test_files_hold_every_user_file_the_model_file_imports(tmp_path):
    """A sibling module, a package of the user's and what they import in turn; not torch's or the stdlib's."""
    tag = uuid.uuid4().hex[:8]
    write(tmp_path, f"metric_{tag}.py", f"import json\nfrom helper_{tag} import scale\n\n"
                                        "def score(y):\n    return float(y.sum()) * scale\n")
    write(tmp_path, f"helper_{tag}.py", "scale = 1.0\n")
    (tmp_path / f"pkg_{tag}").mkdir()
    write(tmp_path / f"pkg_{tag}", "__init__.py", "")
    write(tmp_path / f"pkg_{tag}", "layers.py", "from torch import nn\n\nclass Block(nn.Linear):\n    pass\n")
    model = write(tmp_path, "model.py", textwrap.dedent(f"""\
        import os
        import torch
        from metric_{tag} import score
        from pkg_{tag}.layers import Block


        def build_model():
            torch.manual_seed(0)
            return Block(4, 2)


        def evaluate(model):
            return score(model(torch.ones(1, 4)))
    """))
    for _ in range(2):  # the second load finds the modules already imported: the walk still sees them
        user = load_user_model(str(model))
        names = [f.name for f in user.files]
        assert user.files[0] == model.resolve()
        assert sorted(names) == sorted(["model.py", f"metric_{tag}.py", f"helper_{tag}.py", "__init__.py",
                                        "layers.py"])
        assert not any("torch" in str(f) or f.name == "json.py" for f in user.files)


def test_a_spec_file_and_its_imports_are_in_files_once(tmp_path):
    tag = uuid.uuid4().hex[:8]
    write(tmp_path, f"util_{tag}.py", "K = 1\n")
    write(tmp_path, "evalfile.py", f"from util_{tag} import K\n\ndef evaluate(model):\n    return float(K)\n")
    model = write(tmp_path, "model.py", TINY)
    user = load_user_model(str(model), eval="evalfile.py:evaluate")
    assert [f.name for f in user.files] == ["model.py", "evalfile.py", f"util_{tag}.py"]


def test_evaluate_returning_none_under_a_decorator_names_the_users_line(tmp_path):
    """`@torch.no_grad()` wraps evaluate in torch's _contextlib.py: the error names the user's def, not torch's."""
    source = TINY.replace("def evaluate(model):", "def evaluate_old(model):")
    path = write(tmp_path, "model.py", source + "\n\n@torch.no_grad()\ndef evaluate(model):\n    torch.ones(1)\n")
    with pytest.raises(UserCodeError) as info:
        load_user_model(str(path)).evaluate(None)
    assert "evaluate returned None" in one_line(info.value)
    line = line_of(path, "def evaluate(model):")
    assert info.value.where in (f"model.py:{line - 1}", f"model.py:{line}")  # the decorator's line on Python < 3.12

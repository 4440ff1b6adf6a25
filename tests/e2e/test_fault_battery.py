"""Fault battery: user-code errors in the right class, bounded YAML, plans for another model, rules as data.

CLI behaviour is checked through click's CliRunner (exit code and the first
stderr line); library behaviour directly. Every model here is tiny and CPU-only.
"""
from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import tuner
from mpt_cli import exitcodes
from mpt_cli.main import main
from tuner.report.checkpoint import load, save_checkpoint
from tuner.core.errors import ConfigError, PlanMismatchError, UserCodeError
from tuner.core.fingerprint import sha256_file, structure_digest
from tuner.core.loader import call_forward, load_user_model
from tuner.policy.plan import ModelRef, OpInstance, Plan
from tuner.policy.presets import OpProblemKind, load_preset, op_list_problems, policy_from_dict, read_op_list
from tuner.measure.ranking import rank_exact, rank_gradient
from tuner.policy.rules import Rule
from tuner.core.yamlio import load_yaml_file

HEADER = "import torch\nfrom torch import nn\n\n\n"
BUILD = ("def build_model():\n    torch.manual_seed(0)\n"
         "    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))\n")
INPUTS = "def example_inputs():\n    return (torch.ones(3, 4),)\n"


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def line_of(path: Path, marker: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if marker in line)


def mpt(runner, *args):
    res = runner.invoke(main, [str(a) for a in args])
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise AssertionError(f"mpt raised instead of exiting: {res.exception!r}\n{res.output}")
    return res


def first_error(res, code: int) -> str:
    """The first stderr line, after checking the exit code and that no traceback was printed."""
    assert res.exit_code == code, f"exit {res.exit_code}, expected {code}\n{res.output}"
    assert "Traceback" not in res.stderr, res.stderr
    first = res.stderr.splitlines()[0]
    assert first.startswith("mpt: error: "), first
    return first


# --- 1. the user's code fails: exit 4 at the user's line ------------------------------------------------------

WRONG_SHAPE = Path(__file__).parents[1] / "assets" / "loader" / "wrong_shape.py"  # example_inputs() one feature too wide


def test_inspect_forward_raising_is_exit_4_at_the_users_line(runner):
    first = first_error(mpt(runner, "inspect", WRONG_SHAPE), exitcodes.USER_CODE)
    assert first.startswith("mpt: error: forward raised RuntimeError: "), first
    assert first.endswith(f"(wrong_shape.py:{line_of(WRONG_SHAPE, '# FORWARD')})"), first


def test_inspect_model_library_call_raises_user_code_error():
    user = load_user_model(str(WRONG_SHAPE), require_eval=False)
    with pytest.raises(UserCodeError) as info:
        tuner.inspect_model(user.build(), user.example_inputs(), "torch-cpu", "bf16")
    assert info.value.where == f"wrong_shape.py:{line_of(WRONG_SHAPE, '# FORWARD')}"


META = HEADER + """\
def build_model():  # BUILD
    with torch.device("meta"):
        return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))


""" + INPUTS


def test_build_model_on_the_meta_device_is_exit_4(runner, tmp_path):
    model = write(tmp_path, "model.py", META)
    first = first_error(mpt(runner, "inspect", model), exitcodes.USER_CODE)
    assert "build_model returned a model on the meta device (all its tensors)" in first
    assert "not materialized" in first and first.endswith(f"(model.py:{line_of(model, '# BUILD')})")


def test_build_model_partly_on_the_meta_device_names_a_tensor(tmp_path):
    source = HEADER + textwrap.dedent("""\
        def build_model():
            net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
            with torch.device("meta"):
                net[1] = nn.Linear(4, 2)
            return net
        """)
    user = load_user_model(str(write(tmp_path, "model.py", source)), require_eval=False)
    with pytest.raises(UserCodeError, match=r"meta device \(2 of 4 tensors, e.g. '1.weight'\)"):
        user.build()


class _Raises(nn.Module):
    def forward(self, x):
        return x.view(7)  # RAISES


class _Nested(nn.Module):
    def forward(self, x):
        raise UserCodeError("evaluate raised ValueError: no", where="metrics.py:3")


def test_call_forward_names_the_forward_file_and_line():
    with pytest.raises(UserCodeError) as info:
        call_forward(_Raises(), (torch.ones(2, 3),))
    assert str(info.value).startswith("forward raised RuntimeError: ")
    assert info.value.where == f"test_fault_battery.py:{line_of(Path(__file__), '# RAISES')}"
    assert isinstance(info.value.original, RuntimeError)


def test_call_forward_never_points_into_torch_and_passes_user_code_errors_through():
    with pytest.raises(UserCodeError) as info:
        call_forward(nn.Sequential(nn.Linear(4, 2)), (torch.ones(2, 5),), what="baseline forward")
    assert str(info.value).startswith("baseline forward raised RuntimeError: ") and info.value.where is None
    with pytest.raises(UserCodeError) as nested:
        call_forward(_Nested(), (torch.ones(1),))
    assert str(nested.value) == "evaluate raised ValueError: no (metrics.py:3)"
    assert call_forward(nn.Identity(), (torch.ones(2),)).tolist() == [1.0, 1.0]


class _IndexNet(nn.Module):
    """An integer parameter (an index table), as some models keep one."""

    def __init__(self):
        super().__init__()
        self.idx = nn.Parameter(torch.tensor([0, 2, 3]), requires_grad=False)
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc2(self.fc1(x)[:, self.idx])


@pytest.mark.parametrize("scorer", [rank_gradient, rank_exact])
def test_ranking_survives_integer_parameters(scorer):
    model = _IndexNet()
    model.fc2.weight.requires_grad_(False)
    x = (torch.randn(5, 4),)
    with torch.no_grad():
        ref = model(*x)
    cands = [OpInstance("fc1", "linear", 0), OpInstance("fc2", "linear", 0)]
    scores = scorer(model, x, load_preset("torch-cpu"), torch.bfloat16, cands, ref)
    assert set(scores) == set(cands) and all(s >= 0 and s != float("inf") for s in scores.values())
    assert not model.idx.requires_grad and not model.fc2.weight.requires_grad and model.fc1.weight.requires_grad


# --- 2. op lists and YAML: BOM accepted, aliases refused ------------------------------------------------------

BOM = "\ufeff"


def test_op_lists_with_a_byte_order_mark(tmp_path):
    text = tmp_path / "lower.txt"
    text.write_text(BOM + "linear\n# comment\nmatmul\n", encoding="utf-8")
    assert read_op_list(text) == ["linear", "matmul"]
    yml = tmp_path / "lower.yaml"
    yml.write_text(BOM + "ops: [linear, conv2d]\n", encoding="utf-8")
    assert read_op_list(yml) == ["linear", "conv2d"]


def test_plan_with_a_byte_order_mark(tmp_path):
    Plan(dtype="bf16", preset="hmp").save(tmp_path / "plan.yaml")
    (tmp_path / "plan.yaml").write_text(BOM + (tmp_path / "plan.yaml").read_text(), encoding="utf-8")
    assert Plan.load(tmp_path).preset == "hmp"


def test_config_with_a_byte_order_mark_and_one_with_aliases(runner, tmp_path):
    write(tmp_path, "model.py", HEADER + BUILD + "\n\n" + INPUTS)
    (tmp_path / "mpt.yaml").write_text(BOM + "version: 1\nmodel: model.py\npreset: hmp\n", encoding="utf-8")
    res = mpt(runner, "inspect", "--config", tmp_path / "mpt.yaml")
    assert res.exit_code == 0 and "hmp bf16:" in res.stdout, res.output
    (tmp_path / "mpt.yaml").write_text("version: 1\nmodel: &m model.py\npreset: *m\n")
    first = first_error(mpt(runner, "inspect", "--config", tmp_path / "mpt.yaml"), exitcodes.USAGE)
    assert "YAML aliases (*m) are not supported at line 3" in first


def test_inspect_reads_an_op_list_with_a_byte_order_mark(runner, tmp_path):
    model = write(tmp_path, "model.py", HEADER + BUILD + "\n\n" + INPUTS)
    (tmp_path / "lower.txt").write_text(BOM + "linear\n", encoding="utf-8")
    res = mpt(runner, "inspect", model, "--lower-list", tmp_path / "lower.txt")
    assert res.exit_code == 0, res.output


def alias_bomb(levels: int = 9) -> str:
    """The "billion laughs": each level lists the previous one nine times (9**9 strings when expanded)."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for n in range(1, levels):
        lines.append(f"a{n}: &a{n} [" + ", ".join([f"*a{n - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_alias_bomb_is_refused_fast_with_a_short_message(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    start = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        load_yaml_file(path)
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, f"took {elapsed:.2f} s"
    msg = str(info.value)
    assert msg == f"{path}: YAML aliases (*a0) are not supported at line 2, column 10"
    assert len(msg) < 200


@pytest.mark.parametrize("reader", ["plan", "op list"])
def test_every_yaml_reader_refuses_aliases(tmp_path, reader):
    path = tmp_path / "x.yaml"
    path.write_text(alias_bomb(3))
    read = {"plan": Plan.load, "op list": read_op_list}[reader]
    with pytest.raises(ConfigError, match=r"YAML aliases \(\*a0\) are not supported"):
        read(path)


def test_anchors_without_aliases_still_load(tmp_path):
    path = tmp_path / "ops.yaml"
    path.write_text("ops: &o [linear, matmul]\n")
    assert read_op_list(path) == ["linear", "matmul"]


def test_inspect_with_an_alias_bomb_op_list_is_exit_2(runner, tmp_path):
    model = write(tmp_path, "model.py", HEADER + BUILD + "\n\n" + INPUTS)
    (tmp_path / "bomb.yaml").write_text(alias_bomb())
    first = first_error(mpt(runner, "inspect", model, "--fp32-list", tmp_path / "bomb.yaml"), exitcodes.USAGE)
    assert "YAML aliases (*a0) are not supported" in first and len(first) < 300


# --- 3. a plan made for another model is refused ---------------------------------------------------------------

def _net(width: int = 4) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 2))


def _plan_for(model: nn.Module, **kw) -> Plan:
    return Plan(dtype="bf16", preset="torch-cpu", fp32_instances=(OpInstance("2", "linear", 0),),
                model=ModelRef(file="m.py", structure=structure_digest(model)), **kw)


def test_attach_refuses_a_plan_for_another_model():
    plan = _plan_for(_net())
    with pytest.raises(PlanMismatchError, match=r"made for another model \(m\.py\)"):
        tuner.attach(_net(width=8), plan)
    x = torch.randn(2, 4)
    assert tuner.attach(_net(), plan)(x).dtype == torch.float32  # the same architecture is accepted
    legacy = Plan(dtype="bf16", preset="torch-cpu", fp32_instances=plan.fp32_instances)  # no `model:`
    assert tuner.attach(_net(width=8), legacy)(x).shape == (2, 2)


def _tuned_dir(folder: Path, model: nn.Module) -> Plan:
    """What `mpt tune` writes: the checkpoint, then plan.yaml recording the model and the checkpoint's hash."""
    plan = _plan_for(model)
    save_checkpoint(model, plan, (torch.randn(2, 4),), folder / "model.safetensors")
    plan = _plan_for(model, checkpoint_sha256=sha256_file(folder / "model.safetensors"))
    plan.save(folder / "plan.yaml")
    return plan


def test_load_checks_structure_and_checkpoint_hash(tmp_path):
    _tuned_dir(tmp_path, _net())
    x = torch.randn(2, 4)
    assert load(_net(), tmp_path)(x).shape == (2, 2)
    other = _net(width=8)
    before = other[0].weight.clone()
    with pytest.raises(PlanMismatchError, match="made for another model"):
        load(other, tmp_path)
    assert torch.equal(other[0].weight, before)  # refused before anything was loaded
    data = bytearray((tmp_path / "model.safetensors").read_bytes())
    data[-1] ^= 0x01  # one bit of the last weight: the file still parses
    (tmp_path / "model.safetensors").write_bytes(bytes(data))
    expected = "model.safetensors does not match plan.yaml: its sha256 differs (corrupted or replaced)"
    with pytest.raises(PlanMismatchError) as info:
        load(_net(), tmp_path)
    assert expected in str(info.value)


def test_load_accepts_plans_without_model_or_hash(tmp_path):
    model = _net()
    plan = Plan(dtype="bf16", preset="torch-cpu")
    save_checkpoint(model, plan, (torch.randn(2, 4),), tmp_path / "model.safetensors")
    plan.save(tmp_path / "plan.yaml")
    assert load(_net(), tmp_path)(torch.randn(2, 4)).shape == (2, 2)


def test_inspect_plan_for_another_model_is_exit_2(runner, tmp_path):
    model = write(tmp_path, "model.py", HEADER + BUILD + "\n\n" + INPUTS)
    _plan_for(_net(width=8)).save(tmp_path / "other.yaml")
    first = first_error(mpt(runner, "inspect", model, "--plan", tmp_path / "other.yaml"), exitcodes.USAGE)
    assert first == ("mpt: error: the plan was made for another model (m.py): its module tree or parameter "
                     "shapes differ from this model's")
    _plan_for(_net()).save(tmp_path / "same.yaml")
    assert mpt(runner, "inspect", model, "--plan", tmp_path / "same.yaml").exit_code == 0


# --- 4. rules are data ----------------------------------------------------------------------------------------

class _InPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        return torch.relu_(h)


def test_inspect_reports_rules_as_enum_and_replays_in_place_ops_on_their_input_before_the_write():
    result = tuner.inspect_model(_InPlace(), (torch.randn(3, 4),), "torch-cpu", "bf16")
    by_op = {r.op: r for r in result.records}
    assert by_op["linear"].rule is Rule.LOWER and by_op["linear"].local_error is not None
    assert by_op["linear"].error < 0.05  # compared with its FP32 output as made, not as relu_ left it
    relu = by_op["relu_"]
    assert relu.rule is Rule.INPLACE and relu.reason == "in-place: not autocast"
    assert relu.local_error is not None and relu.local_error < 0.05
    data = json.loads(json.dumps(result.to_dict(), default=str))
    assert {(r["op"], r["rule"], r["reason"]) for r in data["records"]} >= {
        ("linear", "lower", "lower list"), ("relu_", "inplace", "in-place: not autocast")}


def test_rule_properties():
    assert {r for r in Rule if r.forced} == {Rule.INPLACE, Rule.INPLACE_FIRST_INPUT, Rule.OUT, Rule.OUT_FIRST_INPUT,
                                            Rule.EXPLICIT_DTYPE, Rule.FLOAT64, Rule.OTHER_DEVICE, Rule.NO_FLOAT,
                                            Rule.MODEL_FP32, Rule.MODEL_AUTOCAST}
    assert {r for r in Rule if r.mutates} == {Rule.INPLACE, Rule.INPLACE_FIRST_INPUT, Rule.OUT, Rule.OUT_FIRST_INPUT}
    assert all(r.text for r in Rule) and Rule.LOWER == "lower" and f"{Rule.OUT}" == "out"
    assert Rule.INSTANCE.describe("fp32") == "instance override: fp32"


def test_op_list_problems_are_structured():
    kinds = [p.kind for p in op_list_problems(["linear", "linear", "matmull", ""], "lower")]
    assert kinds == [OpProblemKind.DUPLICATE, OpProblemKind.UNKNOWN, OpProblemKind.NOT_A_NAME]
    # A preset file reports its duplicates (a frozenset would hide them) and Policy() the rest.
    with pytest.raises(ConfigError) as info:
        policy_from_dict({"lower": ["linear", "linear"], "fp32": ["softmax", "softmax"]}, source="p.yaml")
    assert info.value.errors == ["lower: op 'linear' is listed twice", "fp32: op 'softmax' is listed twice"]

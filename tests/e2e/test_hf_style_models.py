"""HF-style models: keyword inputs (ModelInputs) and dict/dataclass outputs, through loader, journal, audit and CLI."""
from __future__ import annotations

import json
import math
from collections import namedtuple
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from mpt_cli.main import main
from tuner.measure.inspection import relative_error
from tuner.core.errors import UserCodeError
from tuner.core.inputs import ModelInputs
from tuner.core.output_files import INPUTS_NAME
from tuner.workspace.journal import Journal, RunFingerprint
from tuner.core.loader import call_forward, load_user_model

KWARGS_MODEL = Path(__file__).parents[1] / "assets" / "kwargs_model.py"


def line_of(path: Path, fragment: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if fragment in line)


# --- keyword inputs reach forward ------------------------------------------------------------------------

def test_dict_example_inputs_are_keyword_args_and_call_forward_passes_them():
    user = load_user_model(str(KWARGS_MODEL))
    inputs = user.example_inputs()
    assert isinstance(inputs, ModelInputs) and inputs.args == ()
    assert list(inputs.kwargs) == ["input_ids", "attention_mask"]
    model = user.build()
    with torch.no_grad():
        out = call_forward(model, inputs)
        direct = model(**inputs.kwargs)
        unmasked = model(inputs.kwargs["input_ids"])
    assert out.input_ids.dtype == torch.int64 and torch.equal(out.pooled, direct.pooled)
    assert not torch.allclose(out.pooled[1], unmasked.pooled[1])  # the mask reached forward, by keyword


def test_call_forward_takes_a_tuple_or_model_inputs_and_keeps_user_error_semantics():
    user = load_user_model(str(KWARGS_MODEL))
    model = user.build()
    ids = user.example_inputs().kwargs["input_ids"]
    with torch.no_grad():
        by_tuple = call_forward(model, (ids,))
        by_inputs = call_forward(model, ModelInputs(kwargs={"input_ids": ids}))
    assert torch.equal(by_tuple.pooled, by_inputs.pooled)
    with pytest.raises(UserCodeError) as info:  # an id out of the vocabulary fails inside the user's forward
        call_forward(model, ModelInputs(kwargs={"input_ids": ids + 1000}))
    assert info.value.where == f"kwargs_model.py:{line_of(KWARGS_MODEL, '# FORWARD')}"
    with pytest.raises(UserCodeError) as info:  # a keyword the forward does not take
        call_forward(model, ModelInputs(kwargs={"input_ids": ids, "token_type_ids": ids}))
    assert "token_type_ids" in str(info.value)


def test_unpacking_model_inputs_gives_positional_args_and_refuses_to_drop_keywords():
    x = torch.ones(2)
    assert tuple(ModelInputs.of((x, 3))) == (x, 3)
    with pytest.raises(TypeError, match="keyword arguments"):
        tuple(ModelInputs.of({"input_ids": x}))


# --- errors over every floating-point leaf ---------------------------------------------------------------
# The reference's float leaves are a=[3, 4] (norm 5) and b=[0, 0, 12] (norm 12): ‖ref‖ = 13.
# The output differs by [0, 3] in a and [4, 0, 0] in b: ‖out − ref‖ = 5, so the error is 5/13, while the
# first float leaf alone would give 3/5 and the first tensor (integer ids) 0.

IDS, OTHER_IDS = torch.tensor([1, 2, 3]), torch.tensor([7, 8, 9])
A_REF, B_REF = torch.tensor([3.0, 4.0]), torch.tensor([0.0, 0.0, 12.0])
A_OUT, B_OUT = torch.tensor([3.0, 7.0]), torch.tensor([4.0, 0.0, 12.0])


@dataclass
class Out:
    ids: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor


Pair = namedtuple("Pair", "ids a b")


@pytest.mark.parametrize("make", [
    lambda ids, a, b: {"ids": ids, "a": a, "b": b},
    lambda ids, a, b: Out(ids, a, b),
    lambda ids, a, b: (ids, a, b),
    lambda ids, a, b: Pair(ids, a, b),
    lambda ids, a, b: [ids, {"a": a, "nested": (b,)}],
], ids=["dict", "dataclass", "tuple", "namedtuple", "nested"])
def test_relative_error_counts_every_float_leaf_and_ignores_integer_ones(make):
    err = relative_error(make(OTHER_IDS, A_OUT, B_OUT), make(IDS, A_REF, B_REF))
    assert err == pytest.approx(5 / 13, rel=1e-12)
    assert relative_error(make(OTHER_IDS, A_REF, B_REF), make(IDS, A_REF, B_REF)) == 0.0


def test_relative_error_on_a_transformers_model_output():
    pytest.importorskip("transformers")
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    ref = BaseModelOutputWithPooling(last_hidden_state=A_REF, pooler_output=B_REF)
    out = BaseModelOutputWithPooling(last_hidden_state=A_OUT, pooler_output=B_OUT)
    assert relative_error(out, ref) == pytest.approx(5 / 13, rel=1e-12)


def test_relative_error_is_none_when_outputs_do_not_pair_up():
    assert relative_error((A_OUT, B_OUT), (A_REF,)) is None  # another count
    assert relative_error((A_OUT, B_OUT[:2]), (A_REF, B_REF)) is None  # another shape
    assert relative_error((IDS,), (OTHER_IDS,)) is None  # no float leaf
    assert relative_error(None, A_REF) is None


def test_relative_error_nan_inf_and_zero_reference():
    assert math.isnan(relative_error((A_REF, torch.tensor([float("nan"), 0.0, 0.0])), (A_REF, B_REF)))
    assert relative_error((A_REF, torch.tensor([float("inf"), 0.0, 0.0])), (A_REF, B_REF)) == math.inf
    assert relative_error(torch.ones(2), torch.zeros(2)) == math.inf
    assert relative_error(torch.zeros(2), torch.zeros(2)) == 0.0
    assert relative_error(torch.zeros(2), torch.ones(2)) == 1.0


def test_relative_error_mixed_dtypes_are_compared_in_float64():
    ref = {"ids": IDS, "a": A_REF, "b": B_REF}
    out = {"ids": IDS, "a": A_OUT.bfloat16(), "b": B_OUT.half()}
    assert relative_error(out, ref) == pytest.approx(5 / 13, rel=1e-12)


# --- mpt inspect on the HF-like model ----------------------------------------------------------------------

def test_inspect_cli_on_a_kwargs_model_reports_a_nonzero_output_error(runner):
    res = runner.invoke(main, ["inspect", str(KWARGS_MODEL), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert 0.0 < data["summary"]["output_error"] < 0.05  # over the float tensors, not the integer input_ids
    assert {("dense", "linear"), ("head", "linear")} <= {(r["module"], r["op"]) for r in data["records"]}
    plain = runner.invoke(main, ["inspect", str(KWARGS_MODEL)])
    assert plain.exit_code == 0, plain.output
    shown = plain.output.rsplit("output error ", 1)[1].split()[0]
    assert float(shown) > 0.0


# --- journal inputs round-trip -----------------------------------------------------------------------------

def _journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "journal.jsonl", RunFingerprint(source="s", weights="w"), resume=False)


def _same(a: ModelInputs, b: ModelInputs) -> bool:
    def eq(x, y):
        return torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
    return (len(a.args) == len(b.args) and all(eq(x, y) for x, y in zip(a.args, b.args))
            and list(a.kwargs) == list(b.kwargs) and all(eq(a.kwargs[k], b.kwargs[k]) for k in a.kwargs))


def test_journal_keeps_keyword_inputs(tmp_path):
    inputs = load_user_model(str(KWARGS_MODEL)).example_inputs()
    journal = _journal(tmp_path)
    assert journal.save_inputs(inputs) and (tmp_path / INPUTS_NAME).is_file()
    loaded = _journal_resumed(tmp_path).load_inputs()
    assert isinstance(loaded, ModelInputs) and _same(loaded, inputs)
    assert loaded.kwargs["input_ids"].dtype == torch.int64


def _journal_resumed(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "journal.jsonl", RunFingerprint(source="s", weights="w"), resume=True)


def test_journal_keeps_positions_scalars_and_nones(tmp_path):
    x, y = torch.randn(2, 3), torch.arange(4)
    inputs = ModelInputs((x, None, y, 3, "mean"), {"mask": None, "scale": 0.5, "flag": True})
    journal = _journal(tmp_path)
    assert journal.save_inputs(inputs)
    loaded = journal.load_inputs()
    assert _same(loaded, inputs) and loaded.args[1] is None and loaded.kwargs["mask"] is None


def test_journal_accepts_a_tuple_and_refuses_what_it_cannot_store(tmp_path):
    journal = _journal(tmp_path)
    x = torch.randn(3)
    assert journal.save_inputs((x,)) and _same(journal.load_inputs(), ModelInputs((x,)))
    assert not journal.save_inputs(({"nested": x},))  # a container argument: not storable
    assert not journal.save_inputs(ModelInputs(kwargs={"obj": object()}))


def test_journal_unreadable_inputs_are_recorded_again(tmp_path):
    journal = _journal(tmp_path)
    assert journal.load_inputs() is None  # none kept
    (tmp_path / INPUTS_NAME).write_bytes(b"not safetensors")
    assert journal.load_inputs() is None

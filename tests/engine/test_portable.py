"""A loaded model keeps its plan through torch.save/torch.load and deepcopy, and inspect_model reports the plan
it runs (tuner.engine.portable, tuner.engine.attach.suspended)."""
import copy
import io

import pytest
import torch

import tuner
from tuner.policy.plan import OpInstance, Plan
from tuner.testing import PlantedTask

TASK = PlantedTask(8, 1, samples=64)


def _plan() -> Plan:
    return Plan(dtype="bf16", preset="torch-cpu", fp32_instances=(OpInstance("branches.0", "linear", 0),))


def _round_trip(model: torch.nn.Module) -> torch.nn.Module:
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


@pytest.mark.parametrize("engine", ["auto", "python"])
def test_a_loaded_model_pickles_and_runs_its_plan_after(engine):
    x = TASK.example_inputs()[0]
    model = tuner.load(TASK.build(), _plan(), engine=engine)
    want = model(x)
    fp32 = TASK.build()(x)
    assert not torch.equal(want, fp32)  # the plan changes the numbers: equality below is the plan's
    restored = _round_trip(model)
    assert torch.equal(restored(x), want)
    assert tuner.attached(restored).path is tuner.attached(model).path
    again = _round_trip(restored)  # a restored model pickles too, before and after its first call
    assert torch.equal(again(x), want)
    copied = copy.deepcopy(model)
    assert torch.equal(copied(x), want) and copied.chain[0].weight is not model.chain[0].weight
    assert torch.equal(model(x), want)  # the original is untouched by all of it
    tuner.detach(restored)
    assert torch.equal(restored(x), fp32) and tuner.attached(restored) is None


def test_a_restored_model_detaches_before_its_first_call():
    restored = _round_trip(tuner.load(TASK.build(), _plan()))
    tuner.detach(restored)
    x = TASK.example_inputs()[0]
    assert torch.equal(restored(x), TASK.build()(x))


def test_inspect_model_of_a_loaded_model_reports_the_plan_it_runs():
    x = TASK.example_inputs()
    plain = tuner.inspect_model(TASK.build(), x, _plan())
    model = tuner.load(TASK.build(), _plan())
    seen = tuner.inspect_model(model, x)  # no policy: the attached plan
    assert seen.summary.lower_flop_share == pytest.approx(plain.summary.lower_flop_share)
    assert seen.summary.lower_flop_share < 1.0
    assert seen.summary.output_error == pytest.approx(plain.summary.output_error)
    assert tuner.inspect_model(TASK.build(), x).summary.lower_flop_share == 1.0  # torch-cpu lowers all
    assert torch.equal(model(x[0]), tuner.load(TASK.build(), _plan())(x[0]))  # attached again after


def test_hf_save_pretrained_of_a_loaded_model_reloads_and_runs_the_plan(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=32)
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (2, 8))
    plan = Plan(dtype="bf16", preset="torch-cpu",
                fp32_instances=(OpInstance("encoder.layer.0.attention.self.query", "linear", 0),))
    model = tuner.load(transformers.BertModel(config).eval(), plan)
    want = model(input_ids=ids).last_hidden_state
    model.save_pretrained(tmp_path / "hf")
    again = tuner.load(transformers.BertModel.from_pretrained(tmp_path / "hf").eval(), plan)
    assert torch.equal(again(input_ids=ids).last_hidden_state, want)
    restored = _round_trip(model)
    assert torch.equal(restored(input_ids=ids).last_hidden_state, want)

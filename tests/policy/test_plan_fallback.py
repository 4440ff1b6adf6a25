"""A plan with a fallback chain (issue 46): the op instances it runs in the other 16-bit dtype are recorded, read
back, handed to the engine, and refused when they cannot be right; a plan without one reads and writes as before."""
import pytest
import torch
import yaml

from tuner.core.errors import ConfigError
from tuner.options.config import SCHEMA, validate_config
from tuner.options.tune import TuneOptions
from tuner.policy.plan import OpInstance, Plan

MUL, DOWN, HEAD = OpInstance("mlp1", "mul", 0), OpInstance("mlp1.down_proj", "linear", 0), OpInstance("head", "linear")


def test_fallback_instances_round_trip_and_reach_the_engine_in_their_dtype(tmp_path):
    plan = Plan(dtype="float16", fallback="bfloat16", fallback_instances=(MUL, DOWN), fp32_instances=(HEAD,))
    assert plan.fallback == "bf16" and plan.fallback_dtype is torch.bfloat16
    assert plan.instance_overrides() == {MUL.key(): torch.bfloat16, DOWN.key(): torch.bfloat16,
                                         HEAD.key(): torch.float32}
    assert plan.instance_dtypes() == {MUL: "bf16", DOWN: "bf16", HEAD: "fp32"}
    plan.save(tmp_path / "plan.yaml")
    data = yaml.safe_load((tmp_path / "plan.yaml").read_text())
    assert data["fallback"] == "bf16"
    assert data["fallback_instances"] == [{"module": "mlp1", "op": "mul", "index": 0},
                                          {"module": "mlp1.down_proj", "op": "linear", "index": 0}]
    again = Plan.load(tmp_path / "plan.yaml")
    assert again == plan and again.instance_overrides() == plan.instance_overrides()


def test_a_plan_without_a_chain_writes_no_fallback_keys():
    """Plans from before fallback chains read and write byte for byte as they did."""
    data = Plan(dtype="fp16", fp32_instances=(HEAD,)).to_dict()
    assert "fallback" not in data and "fallback_instances" not in data
    assert Plan.from_dict(data) == Plan(dtype="fp16", fp32_instances=(HEAD,))


@pytest.mark.parametrize(("data", "fragment"), [
    ({"dtype": "fp16", "fallback": "fp16"}, "the other 16-bit dtype"),
    ({"dtype": "fp16", "fallback_instances": [{"module": "a", "op": "linear", "index": 0}]}, "no fallback dtype"),
    ({"dtype": "fp16", "fallback": "bf16", "fallback_instances": [{"module": "a", "op": "linear"}],
      "fp32_instances": [{"module": "a", "op": "linear"}]}, "in fp32_instances too"),
    ({"dtype": "bf16", "fallback": "fp32"}, "fallback"),
    ({"dtype": "bf16", "fallback": "fp16", "fallback_instances": [{"module": "a"}]}, "fallback_instances[0]"),
])
def test_a_wrong_chain_is_refused_with_the_key_named(data, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("[", r"\[")):
        Plan.from_dict(data)


def test_the_option_is_one_field_read_from_a_config_too():
    assert TuneOptions(dtype="half", fallback="bfloat16").fallback == "bf16"
    assert TuneOptions(dtype="fp16", fallback="bf16").settings()["fallback"] == "bf16"
    assert "fallback" not in TuneOptions(dtype="fp16").settings()  # journals from before still resume
    with pytest.raises(ConfigError, match="the tune's own dtype"):
        TuneOptions(dtype="bf16", fallback="bf16")
    assert validate_config({"version": 1, "dtype": "fp16", "fallback": "bf16"}, SCHEMA, command="tune")["fallback"] == "bf16"

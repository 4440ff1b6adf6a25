"""`mpt check` on a plan with a fallback chain (issue 46): its fallback instances are checked against the model
as its FP32 ones are (a module the model lacks is refused, a call it no longer makes is named stale)."""
import pytest

from tests.assets import fp16_chains
from tuner.core.errors import PlanMismatchError
from tuner.core.inputs import ModelInputs
from tuner.jobs.check_run import _check_modules, _unused_instances
from tuner.policy.plan import OpInstance, Plan


def _plan(*instances):
    return Plan(dtype="fp16", fallback="bf16", fallback_instances=instances)


def test_a_stale_fallback_instance_is_named_and_a_missing_module_refused():
    model = fp16_chains.build_geglu().eval()
    inputs = ModelInputs.of(fp16_chains.example_inputs())
    plan = _plan(OpInstance("mlp1", "mul", 0), OpInstance("mlp1", "mul", 7))
    assert _unused_instances(model, plan, inputs) == ["mlp1:mul#7"]
    with pytest.raises(PlanMismatchError, match="mlp9"):
        _check_modules(model, _plan(OpInstance("mlp9", "mul", 0)))

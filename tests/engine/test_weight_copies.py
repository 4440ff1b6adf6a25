"""An inference forward under a plan keeps no second, lower-precision copy of the weights (issue 20: peak
memory): torch.autocast's weight cache and mpt's cast cache are used only under grad mode."""
import torch
from torch import nn

import tuner
from tuner.engine.function_mode import PrecisionEngine
from tuner.policy.plan import Plan
from tuner.policy.presets import load_preset


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.Linear(8, 2)).eval()


def cache_flags_seen(m: nn.Module, grad: bool) -> list[bool]:
    seen: list[bool] = []
    m[2].register_forward_hook(lambda *a: seen.append(torch.is_autocast_cache_enabled()))
    with torch.set_grad_enabled(grad):
        m(torch.randn(3, 8))
    return seen


def test_loaded_plan_caches_cast_weights_only_under_grad_mode():
    plan = Plan(dtype="bf16", preset="torch-cpu", modules=(("3", "fp32"),))
    loaded = tuner.load(model(), plan)
    assert all(p.requires_grad for p in loaded.parameters())  # the case autocast would cache
    assert cache_flags_seen(loaded, grad=False) == [False]
    assert cache_flags_seen(loaded, grad=True) == [True]


def test_python_engine_keeps_no_cast_copy_of_a_weight_in_inference():
    m = model()
    engine = PrecisionEngine(load_preset("torch-cpu"), torch.bfloat16, root=m)
    sizes: list[int] = []
    m[3].register_forward_hook(lambda *a: sizes.append(len(engine.cache._store)))
    with torch.no_grad(), engine:
        m(torch.randn(3, 8))
    with engine:
        m(torch.randn(3, 8)).sum().backward()
    assert sizes[0] == 0 and sizes[1] >= 3  # training: the three weights' bf16 copies are reused for backward

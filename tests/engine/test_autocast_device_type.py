"""`tuner.autocast("cpu", torch.bfloat16)`: torch.autocast's positional `device_type` form means its own lists."""
import pytest
import torch
from torch import nn

import tuner
from tuner.core.errors import ConfigError


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
def test_device_type_means_the_torch_preset(device):
    torch.manual_seed(0)
    net, x = nn.Sequential(nn.Linear(8, 8), nn.Softmax(-1)), torch.randn(2, 8)
    ctx = tuner.autocast(device, torch.bfloat16)
    assert ctx.policy.name == "torch-cpu" and ctx.dtype == torch.bfloat16
    with torch.no_grad():
        with ctx:
            ours = net(x)
        with torch.autocast("cpu", torch.bfloat16):
            theirs = net(x)
    assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)  # the same ops in the same dtypes
    with torch.no_grad(), tuner.autocast("cpu", torch.bfloat16):
        assert net[0](x).dtype == torch.bfloat16


def test_an_unknown_name_is_still_an_unknown_preset():
    with pytest.raises(ConfigError, match="unknown preset 'gpu'"):
        tuner.autocast("gpu", torch.bfloat16)

"""A policy's settings are enums with the values preset files hold."""
import pytest
import yaml

from tuner.core.errors import ConfigError
from tuner.policy.modes import InplaceMode, NativeDevice, UnlistedMode
from tuner.policy.presetfiles import preset_names
from tuner.policy.presets import Policy, load_preset
from tuner.policy.rules import Rule


def test_presets_hold_enum_members():
    hmp = load_preset("hmp")
    assert hmp.unlisted is UnlistedMode.FIRST_INPUT and hmp.inplace is InplaceMode.FIRST_INPUT and hmp.native is None
    torch_cpu = load_preset("torch-cpu")
    assert torch_cpu.unlisted is UnlistedMode.PASSTHROUGH and torch_cpu.inplace is InplaceMode.SKIP
    assert torch_cpu.native is NativeDevice.CPU


def test_strings_are_turned_into_members_and_compare_equal():
    given = Policy("p", unlisted="fp32", inplace="first_input", native="cuda")
    assert given.unlisted is UnlistedMode.FP32 and given.inplace is InplaceMode.FIRST_INPUT
    assert given.native is NativeDevice.CUDA
    assert given == Policy("p", unlisted=UnlistedMode.FP32, inplace=InplaceMode.FIRST_INPUT, native=NativeDevice.CUDA)
    assert given.unlisted_rule is Rule.UNLISTED_FP32
    assert given.unlisted == "fp32" and f"{given.inplace}" == "first_input"  # the file's text


@pytest.mark.parametrize("field,value,message", [
    ("unlisted", "sometimes", "unlisted: expected one of passthrough, first_input, fp32, found 'sometimes'"),
    ("inplace", "never", "inplace: expected one of skip, first_input, found 'never'"),
    ("native", "tpu", "native: expected one of cpu, cuda, null, found 'tpu'"),
])
def test_unknown_settings_are_refused(field, value, message):
    with pytest.raises(ConfigError) as info:
        Policy("p", **{field: value})
    assert message in str(info.value)


@pytest.mark.parametrize("name", preset_names())
def test_to_dict_writes_plain_strings(name):
    data = load_preset(name).to_dict()
    for key in ("unlisted", "inplace", "native"):
        assert data[key] is None or type(data[key]) is str
    yaml.safe_dump(data)  # a str subclass would not be representable

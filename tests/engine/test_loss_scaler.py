"""tuner.LossScaler for a device the machine lacks (issue 45): a clear error, not GradScaler's warning and a scaler
that is silently off (no scaling, no skipped-steps guard)."""
from __future__ import annotations

import pytest
import torch

import tuner
from tuner.core.errors import DeviceError


def test_a_scaler_for_a_missing_device_is_an_error_unless_disabled(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without CUDA, wherever this runs
    with pytest.raises(DeviceError, match=r"LossScaler\('cuda'\): this machine has no CUDA device"):
        tuner.LossScaler("cuda")
    with pytest.raises(DeviceError):
        tuner.LossScaler()  # "cuda" by default, as GradScaler
    assert not tuner.LossScaler("cuda", enabled=False).is_enabled()  # asked for: honoured
    assert not tuner.LossScaler("cuda", 2.0**16, 2.0, 0.5, 2000, False).is_enabled()
    assert tuner.LossScaler("cpu").is_enabled()

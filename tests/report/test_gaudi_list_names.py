"""Gaudi's list files hold names the Gaudi bridge reads (issue 45): ATen op names, or a name Gaudi's own default
lists use (`truediv` in its default FP32 list), whichever preset the plan was tuned with; the docs say so."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tuner.policy.plan import Plan
from tuner.policy.presets import load_preset
from tuner.report.oplists import type_level

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("preset", ["gaudi", "hmp", "torch-cpu"])
def test_gaudi_list_files_name_only_ops_the_gaudi_bridge_reads(preset):
    gaudi = load_preset("gaudi")
    lower, fp32 = type_level(Plan(dtype="bf16", preset=preset)).names("gaudi")
    unread = [n for n in lower + fp32 if not hasattr(torch.ops.aten, n) and n not in gaudi.lower | gaudi.fp32]
    assert not unread
    if preset == "gaudi":
        assert "truediv" in fp32  # Gaudi's own default FP32 list names it: kept as Gaudi spells it


def test_the_docs_do_not_promise_aten_names_only():
    for doc in ("docs/cli.md", "docs/python-api.md"):
        text = (ROOT / doc).read_text(encoding="utf-8")
        assert "truediv" in text and "(ATen names:" not in text

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
    import tuner

    tuner.revert()  # never leak a process-wide switch between tests


@pytest.fixture
def runner():
    from click.testing import CliRunner

    return CliRunner()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

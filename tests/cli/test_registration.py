"""How the commands are wired: registered plainly, with their decisions in the library."""
from __future__ import annotations

import importlib
import sys

import pytest


def test_check_logic_lives_in_the_library():
    import mpt_cli.check_cmd
    import tuner.jobs.check_run

    for name in ("check_plan", "CheckResult", "junit_xml"):
        assert hasattr(tuner.jobs.check_run, name) and not hasattr(mpt_cli.check_cmd, name), name


@pytest.mark.parametrize("module", ["mpt_cli.tune_cmd", "mpt_cli.check_cmd", "mpt_cli.inspect_cmd", "mpt_cli.presets_cmd"])
def test_an_import_error_in_a_command_module_is_not_swallowed(monkeypatch, module):
    monkeypatch.delitem(sys.modules, "mpt_cli.main")
    monkeypatch.setitem(sys.modules, module, None)  # importing it now raises ImportError
    with pytest.raises(ImportError, match=module):
        importlib.import_module("mpt_cli.main")


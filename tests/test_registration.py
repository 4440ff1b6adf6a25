"""How the commands are wired: registered plainly, with their decisions in the library."""
from __future__ import annotations

import importlib
import sys

import pytest


def test_check_logic_lives_in_the_library():
    import cli.check_cmd
    import tuner.check

    for name in ("check_plan", "CheckResult", "junit_xml"):
        assert hasattr(tuner.check, name) and not hasattr(cli.check_cmd, name), name


@pytest.mark.parametrize("module", ["cli.tune_cmd", "cli.check_cmd", "cli.inspect_cmd", "cli.presets_cmd"])
def test_an_import_error_in_a_command_module_is_not_swallowed(monkeypatch, module):
    monkeypatch.delitem(sys.modules, "cli.main")
    monkeypatch.setitem(sys.modules, module, None)  # importing it now raises ImportError
    with pytest.raises(ImportError, match=module):
        importlib.import_module("cli.main")


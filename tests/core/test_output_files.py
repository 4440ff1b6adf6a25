"""One module names every file in a tune's output folder; no other module of tuner spells one of those names."""
from __future__ import annotations

import re
from pathlib import Path

import tuner.core.output_files as files

TUNER = Path(__file__).resolve().parents[2] / "tuner"


def test_every_committed_file_is_an_output_file_and_the_plan_is_last():
    assert set(files.COMMITTED) <= set(files.OUTPUT_FILES)
    assert files.COMMITTED[-1] == files.PLAN_NAME and files.COMMITTED.count(files.PLAN_NAME) == 1
    assert len(set(files.OUTPUT_FILES)) == len(files.OUTPUT_FILES)
    assert {files.JOURNAL_NAME, files.INPUTS_NAME} <= set(files.OUTPUT_FILES) - set(files.COMMITTED)
    assert files.LOCK_NAME not in files.OUTPUT_FILES  # the lock is the run's, not an output
    assert files.MANIFEST_NAME not in files.OUTPUT_FILES  # alone, it does not make a folder hold a run


def test_no_other_module_spells_an_output_file_name():
    names = [*files.OUTPUT_FILES, files.LOCK_NAME, files.STAGING_NAME, files.MANIFEST_NAME]
    literal = re.compile(r"([\"'])(" + "|".join(map(re.escape, names)) + r")\1")
    found = [f"{p.relative_to(TUNER)}: {m.group()}" for p in sorted(TUNER.rglob("*.py"))
             if p.name != "output_files.py" for m in literal.finditer(p.read_text(encoding="utf-8"))]
    assert not found

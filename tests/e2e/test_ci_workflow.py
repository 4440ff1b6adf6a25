"""docs/ci.md's GitHub Actions workflow installs mpt the way a user can and runs commands the docs test runs.

Running the workflow's steps themselves (a fresh clone, a fresh venv, pip installing torch and mpt) takes
minutes and a package index, so it is done by hand with tests/e2e/run_readme_workflow.py (docs/ci.md says
so); this keeps the workflow in step
with what can break: the package name, the install source, the commands and the files it says to commit.
"""
from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.e2e.test_readme_commands import docs_steps
from tuner.core.output_files import COMMITTED, HMP_FP16_NAME, NOT_FOR_GIT

ROOT = Path(__file__).resolve().parents[2]
CI_PAGE = ROOT / "docs" / "ci.md"


def _workflow() -> dict:
    text = CI_PAGE.read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"^```yaml\n(.*?)^```", text, flags=re.S | re.M)
                 if b.startswith("# .github/workflows/"))
    return yaml.safe_load(block)


def _runs(job: dict) -> list[str]:
    return [step["run"] for step in job["steps"] if "run" in step]


def test_workflow_installs_mpt_from_a_source_pip_can_reach():
    flow = _workflow()
    name = re.search(r'^name = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), flags=re.M).group(1)
    source = flow["env"]["MPT_TUNER"]
    assert re.fullmatch(rf"{re.escape(name)} @ git\+https://\S+@v[\d.]+", source), source  # PEP 508, pinned
    for job in flow["jobs"].values():
        installs = [r for r in _runs(job) if r.startswith("pip install")]
        assert re.match(r"pip install torch==[\d.]+\b", installs[0])  # torch pinned, before mpt
        assert any(r.split("#")[0].strip() == 'pip install "$MPT_TUNER"' for r in installs)
        assert not any(re.search(rf"pip install [^#]*\b{re.escape(name)}\b", r) for r in installs)  # not on PyPI
        for step in job["steps"]:  # a requirements file the user may not have is installed only when present
            if "requirements.txt" in step.get("run", ""):
                assert "hashFiles('requirements.txt')" in step["if"]


def test_workflow_commands_are_the_ones_the_readme_test_runs():
    tested = {cmd for kind, cmd in docs_steps() if kind == "run"}
    commands = [r for job in _workflow()["jobs"].values() for r in _runs(job) if r.startswith("mpt ")]
    assert commands
    for cmd in commands:
        assert cmd.replace(" --quiet", "") in tested, cmd


def test_files_the_ci_page_says_to_commit_are_not_git_ignored():
    section = CI_PAGE.read_text(encoding="utf-8")
    add = re.search(r"^git add (.*)$", section, flags=re.M).group(1).split()
    named = {Path(p).name for p in add if p.startswith("mpt/bf16/")}
    assert named == set(COMMITTED) - set(NOT_FOR_GIT) - {HMP_FP16_NAME}  # (an fp16 plan's: this page tunes bf16)
    for name in named:
        assert f"`{name}`" in section[section.index("The `retune` job"):]

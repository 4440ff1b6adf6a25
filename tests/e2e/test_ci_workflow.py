"""docs/ci.md's GitHub Actions workflow installs mpt the way a user can and runs commands the docs test runs.

Running the workflow's steps themselves (a fresh clone, a fresh venv, pip installing torch and mpt) takes
minutes and a package index, so it is done by hand with tests/e2e/run_readme_workflow.py (docs/ci.md says
so); this keeps the workflow in step
with what can break: the package name, the install source, the commands and the files it says to commit.
"""
from __future__ import annotations

import os
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


CI_RUN = ROOT / ".ci" / "run"
ISSUE_47 = {"tests/cli/test_builtin_metrics.py": ["test_tune_with_a_builtin_metric_then_check",
                                                  "test_a_metric_wins_over_evaluate_only_when_named"],
            "tests/e2e/test_deployed.py": ["test_module_list_under_an_fp32_island_runs_low_in_trial_plan_report_and_"
                                           "loaded_model"]}


PLAN_MARK = "@pytest.mark." + "plan"  # spelled apart: .ci/run's grep picks the files that mark tests, not this


def _marked_plan(path: Path) -> set[str]:
    """The tests of a file under the plan mark (read from its source, as .ci/run's grep picks the files)."""
    found, marked = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith(PLAN_MARK):
            marked = True
        elif line.startswith("def test_") and marked:
            found.add(line[4:line.index("(")])
            marked = False
        elif not line.startswith("@"):
            marked = False
    return found


def test_ci_run_shows_its_cpu_paths_and_runs_the_plan_tests_again_below_amx():
    """Issue 47: each pass prints the CPU paths it runs under, and on an AMX CPU the `plan` tests run once more
    with oneDNN capped to AVX512-BF16; the tests that failed on AMX are among them."""
    lines = [line.strip() for line in CI_RUN.read_text(encoding="utf-8").splitlines()]
    passes = [i for i, line in enumerate(lines) if "python -m pytest" in line]
    assert len(passes) == 3
    for i in passes:  # each pass: its CPU paths printed just before, in its own environment
        env = lines[i].split("python -m pytest")[0]
        assert lines[i - 1] == f"{env}python .ci/cpu_paths.py", lines[i - 1]
    gate = lines.index("if python .ci/cpu_paths.py --amx; then")
    amx = lines[passes[1]]
    assert gate < passes[1] < lines.index("fi", gate) < passes[2]
    assert amx.startswith("ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 python -m pytest") and "-m plan" in amx
    assert "grep -rlE --include='test_*.py' 'pytest\\.mark\\.plan\\b' tests" in lines[passes[1] + 1]
    assert re.search(r'^\s+"plan: ', (ROOT / "pyproject.toml").read_text(encoding="utf-8"), flags=re.M)
    for path, names in ISSUE_47.items():
        assert set(names) <= _marked_plan(ROOT / path), path


def test_cpu_paths_names_the_capability_the_kernels_and_amx():
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("mpt_ci_cpu_paths", ROOT / ".ci" / "cpu_paths.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    kernels = mod.matmul_kernels()
    assert set(kernels) == {"bfloat16", "float16"} and all(kernels.values())
    amx = "amx_bf16" in mod.cpu_flags()
    if not amx:
        assert "amx" not in kernels["bfloat16"]  # no AMX kernel without the CPU's AMX
    if os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() in ("AVX2", "AVX512_CORE_BF16"):
        assert "amx" not in kernels["bfloat16"]  # the cap holds
    line = mod.describe(kernels)
    assert f"ATen capability {torch.backends.cpu.get_cpu_capability()};" in line
    assert f"bf16 matmul {kernels['bfloat16']}," in line and f"AMX {'yes' if amx else 'no'};" in line

"""Run docs/ci.md's GitHub Actions workflow as written, as a fresh runner would (by hand: about 2 minutes and a
package index; pytest does not collect it, tests/e2e/test_ci_workflow.py keeps the workflow in step instead).

    python tests/e2e/run_readme_workflow.py [WORKDIR]

What it does, in WORKDIR (default: a new temporary folder):
1. builds mpt's wheel with `pip wheel --no-deps .` in a clean clone of this checkout's HEAD;
2. makes a user's repository: docs/ci.md's `mpt.yaml` verbatim, the bundled example it names with its
   weights, and a `requirements.txt` with what the example imports (scikit-learn);
3. runs the `retune` job (its `run:` steps with MPT_TUNER = the wheel), then docs/ci.md's step 2 (`git add`
   as written, `git commit`, and `git status` must be clean), then the `check` job in a new clone of that commit.
Each job gets a fresh venv (`actions/setup-python`); `actions/checkout` is a git clone, `upload-artifact` a
copy, the JUnit report action a check that the XML is there; `if: hashFiles('requirements.txt') != ''` is
whether the file exists. Exits 1 at the first step that fails.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
GIT_ENV = {"GIT_AUTHOR_NAME": "ci", "GIT_AUTHOR_EMAIL": "ci@example.invalid", "GIT_COMMITTER_NAME": "ci",
           "GIT_COMMITTER_EMAIL": "ci@example.invalid"}


def _sh(cmd: str | list[str], cwd: Path, env: dict[str, str] | None = None, label: str = "") -> str:
    shown = cmd if isinstance(cmd, str) else " ".join(cmd)
    print(f"[{label}] $ {shown}", flush=True)
    args = ["bash", "-e", "-c", cmd] if isinstance(cmd, str) else cmd
    r = subprocess.run(args, cwd=cwd, env={**(env or os.environ), **GIT_ENV}, capture_output=True, text=True)
    tail = "\n".join(ln for ln in (r.stdout + r.stderr).splitlines() if not ln.startswith("WARNING: Location"))
    print(tail[-1200:], flush=True)
    if r.returncode != 0:
        sys.exit(f"[{label}] FAILED (exit {r.returncode}): {shown}")
    return r.stdout


def _readme_blocks(lang: str) -> list[str]:
    text = (ROOT / "docs" / "ci.md").read_text(encoding="utf-8")
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M)


def _user_repo(work: Path) -> Path:
    config = next(b for b in _readme_blocks("yaml") if b.startswith("# mpt.yaml"))
    repo = work / "user-repo"
    model = yaml.safe_load(config)["model"]
    (repo / model).parent.mkdir(parents=True)
    shutil.copy(ROOT / model, repo / model)
    weights = ROOT / Path(model).parent / "weights" / f"{Path(model).stem}.safetensors"
    if weights.is_file():
        (repo / Path(model).parent / "weights").mkdir()
        shutil.copy(weights, repo / Path(model).parent / "weights" / weights.name)
    (repo / "mpt.yaml").write_text(config, encoding="utf-8")
    (repo / "requirements.txt").write_text("scikit-learn>=1.3\n", encoding="utf-8")
    _sh("git init -q && git add -A && git commit -q -m 'a model, mpt.yaml, requirements.txt'", repo, label="user")
    return repo


def _run_job(name: str, job: dict, source: Path, wheel: Path, work: Path) -> Path:
    ws = work / name
    _sh(["git", "clone", "-q", str(source), str(ws / "repo")], work, label=name)
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env.update(MPT_TUNER=str(wheel), OMP_NUM_THREADS="1")
    for step in job["steps"]:
        uses, cond = step.get("uses", ""), step.get("if", "")
        if uses.startswith("actions/setup-python"):
            _sh(["python3", "-m", "venv", str(ws / "venv")], ws, label=name)
            env["PATH"] = f"{ws / 'venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"
        elif uses.startswith("actions/upload-artifact"):
            shutil.copytree(ws / "repo" / step["with"]["path"], ws / "artifact")
            print(f"[{name}] artifact: {sorted(p.name for p in (ws / 'artifact').iterdir())}")
        elif uses.startswith("mikepenz/action-junit-report"):
            xml = ws / "repo" / step["with"]["report_paths"]
            if not xml.is_file():
                sys.exit(f"[{name}] FAILED: no {xml}")
            print(f"[{name}] JUnit report: {xml.read_text(encoding='utf-8').count('<testcase')} test case(s)")
        elif "run" in step and not ("hashFiles('requirements.txt')" in cond
                                    and not (ws / "repo" / "requirements.txt").is_file()):
            _sh(step["run"], ws / "repo", env, label=name)
    return ws


def main() -> None:
    work = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="mpt-workflow-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    _sh(["git", "clone", "-q", str(ROOT), str(work / "mpt")], work, label="wheel")
    _sh(f"{sys.executable} -m pip wheel -q --no-deps . -w {work / 'wheels'}", work / "mpt", label="wheel")
    wheel = next((work / "wheels").glob("mpt_tuner-*.whl"))
    flow = yaml.safe_load(next(b for b in _readme_blocks("yaml") if b.startswith("# .github/workflows/")))
    retune = _run_job("retune", flow["jobs"]["retune"], _user_repo(work), wheel, work)
    user = retune / "repo"  # docs/ci.md step 2: commit what the artifact holds that git should keep
    out = yaml.safe_load((user / "mpt.yaml").read_text(encoding="utf-8"))["out"]
    shutil.rmtree(user / out, ignore_errors=True)
    shutil.copytree(retune / "artifact", user / out)
    add = next(ln for b in _readme_blocks("bash") for ln in b.splitlines() if ln.startswith("git add "))
    _sh(f'{add} && git commit -q -m "bf16 precision plan"', user, label="commit")
    if _sh("git status --short", user, label="commit").strip():
        sys.exit("[commit] FAILED: files left untracked after docs/ci.md's git add")
    _run_job("check", flow["jobs"]["check"], user, wheel, work)
    print(f"docs/ci.md workflow: every step passed (in {work})")


if __name__ == "__main__":
    main()

"""Docs that run: every `mpt` command example in README.md, in order, on a fresh copy of the repository.

The commands are the lines (or `&&`-joined parts of lines) starting with `mpt ` or `python examples/` (a bundled
script that makes a model folder) in README.md's ```bash blocks; the ```yaml block headed `# mpt.yaml` is written to the copy's root where it appears, as a user
following the CI section would. Each command must exit 0; the checks are on exit codes and the files
the commands write, never on their terminal text (which is free to change). Lines that cannot run here
are skipped by the reasons in SKIP, which the test also keeps honest.

The presets table in README.md is checked against `tuner.preset_names()` and the presets' list sizes.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tuner
from tuner.policy.presets import load_preset

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

# A README command containing one of these is not run here, for the reason given.
SKIP = {
    "--device cuda": "needs a CUDA device",
    "torchrun": "needs several processes (tests/search/test_distributed.py covers torchrun)",
}
if importlib.util.find_spec("transformers") is None:  # CI installs the hf extra; a checkout without it skips these
    SKIP.update({"hf:": "needs transformers", "tiny_hf_model.py": "needs transformers"})
# What a fresh clone does not have: build outputs, caches and anything the commands write.
IGNORE = shutil.ignore_patterns(".git", ".venv", ".venv-ci", "__pycache__", "*.egg-info", ".pytest_cache", "build",
                                "dist", "mpt-out", "runs", "mpt", "reports", "retrained", "*.pyc")
COMMAND_TIMEOUT = 120  # seconds per command; the digits examples take a few
# Files the README's commands write, in the order the README shows them.
EXPECTED = ("mpt-out/plan.yaml", "ops.json", "runs/sensor/plan.yaml", "runs/sensor-fp16/plan.yaml",
            "runs/digits_sensor/plan.yaml", "check.xml", "lower.txt", "mpt.yaml", "mpt/bf16/plan.yaml", "reports/mpt-check.xml")


def readme_steps(text: str) -> list[tuple[str, str]]:
    """[("run", command) | ("write mpt.yaml", content) | ("skip", command)] in README order."""
    steps: list[tuple[str, str]] = []
    for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M):
        if lang == "yaml" and body.startswith("# mpt.yaml"):
            steps.append(("write mpt.yaml", body))
        if lang != "bash":
            continue
        for line in body.replace("\\\n", " ").splitlines():  # join continued lines
            for part in (p.strip() for p in line.split(" && ")):
                if any(reason in part for reason in SKIP):
                    steps.append(("skip", part))
                elif part.startswith(("mpt ", "python examples/")):
                    steps.append(("run", part))
    return steps


def test_readme_steps_are_found():
    steps = readme_steps(README.read_text(encoding="utf-8"))
    runs = [s for kind, s in steps if kind == "run"]
    assert runs[0].startswith("mpt tune examples/digits_sensor.py"), "the quick start's tune comes first"
    for command in ("mpt inspect", "mpt tune", "mpt check", "mpt presets"):
        assert any(r.startswith(command) for r in runs), command
    assert any(kind == "write mpt.yaml" for kind, _ in steps)
    assert any(kind == "skip" and "torchrun" in s for kind, s in steps), "SKIP reasons must still match README lines"


# Runs the commands as `mpt` does (`mpt_cli.main:main`, the entry point), each in a forked child of one process
# that imported torch, scikit-learn and mpt once: each command still gets its own process (its own
# sys.modules, signal handlers, locks and exit code) without paying ~2 s of imports 17 times. Supports the
# shell syntax the README uses (`# comments`, `> FILE`); any other line runs under bash with the installed `mpt`.
RUNNER = r"""
import json, os, shlex, subprocess, sys, time
import torch, sklearn.datasets, sklearn.model_selection  # noqa: F401  (what every command imports)
from mpt_cli.main import main
results = []
for step in json.load(sys.stdin):
    words = shlex.split(step, comments=True)
    target = None
    if len(words) >= 2 and words[-2] == ">":
        words, target = words[:-2], words[-1]
    log = f"step{len(results)}"
    t0 = time.monotonic()
    if any(w in ("|", "&&", ";", "<", ">", ">>") for w in words) or words[:1] != ["mpt"]:
        with open(log + ".out", "w") as out, open(log + ".err", "w") as err:
            code = subprocess.run(["bash", "-c", step], stdout=out, stderr=err).returncode
    else:
        pid = os.fork()
        if pid == 0:
            try:
                out = os.open(target or log + ".out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                err = os.open(log + ".err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(out, 1)
                os.dup2(err, 2)
                main.main(args=words[1:], prog_name="mpt")
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:
                import traceback
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    results.append({"step": step, "code": code, "seconds": round(time.monotonic() - t0, 2), "log": log})
    if code != 0:
        break
json.dump(results, sys.stdout)
"""


def _run_commands(commands: list[str], cwd: Path, logs: Path) -> list[dict]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "COLUMNS": "120", "PYTHONPATH": str(ROOT)}
    logs.mkdir()
    runner = logs / "runner.py"
    runner.write_text(f"import os\nos.chdir({str(cwd)!r})\n"
                      + RUNNER.replace('log = f"step', f'log = {str(logs)!r} + f"/step'))
    done = subprocess.run([sys.executable, str(runner)], input=json.dumps(commands), capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=COMMAND_TIMEOUT * len(commands))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.slow
def test_readme_commands_run_in_order(tmp_path):
    pytest.importorskip("sklearn")  # the examples' data
    repo = tmp_path / "repo"
    shutil.copytree(ROOT, repo, ignore=IGNORE)
    t0 = time.monotonic()
    steps = readme_steps(README.read_text(encoding="utf-8"))
    cut = next(i for i, (kind, _) in enumerate(steps) if kind == "write mpt.yaml")
    results = []
    for part in (steps[:cut], steps[cut:]):  # mpt.yaml appears where the README shows it
        if part and part[0][0] == "write mpt.yaml":
            (repo / "mpt.yaml").write_text(part[0][1], encoding="utf-8")
        commands = [step for kind, step in part if kind == "run"]
        results += _run_commands(commands, repo, tmp_path / f"logs{len(results)}")
        for r in results:
            logs = "".join(Path(r["log"] + ext).read_text(errors="replace")[-3000:] for ext in (".out", ".err")
                           if Path(r["log"] + ext).is_file())
            assert r["code"] == 0, f"README command failed (exit {r['code']}): {r['step']}\n{logs}"
    ran = len(results)
    assert ran == sum(kind == "run" for kind, _ in steps) and ran >= 15
    missing = [f for f in EXPECTED if not (repo / f).is_file()]
    assert not missing, f"README commands did not write {missing}"
    assert isinstance(json.loads((repo / "ops.json").read_text()), dict)
    assert (repo / "lower.txt").read_text().split(), "mpt presets --lists-only lower printed no ops"
    print(f"{ran} README commands in {time.monotonic() - t0:.1f}s: "
          + ", ".join(f"{r['seconds']:.1f}" for r in results))


def _preset_rows(text: str) -> dict[str, list[str]]:
    section = text.split("## Presets and their rules", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\| `([\w-]+)` \|(.*)\|\s*$", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in m.group(2).split("|")]
    return rows


def test_readme_presets_table_matches_the_presets():
    text = README.read_text(encoding="utf-8")
    rows = _preset_rows(text)
    assert sorted(rows) == tuner.preset_names()
    header = next(line for line in text.splitlines() if line.startswith("| preset |"))
    column = [c.strip() for c in header.strip("|").split("|")].index("ops: lower / FP32 / promote") - 1
    for name, cells in rows.items():
        p = load_preset(name)
        counts = tuple(int(n) for n in cells[column].split("/"))
        assert counts == (len(p.lower), len(p.fp32), len(p.promote)), f"README's counts for {name}"


def test_presets_are_described_by_what_they_reproduce():
    for name in tuner.preset_names():
        p = load_preset(name)
        for text in (p.description, p.source):
            assert text and not re.search(r"\bseeds?\b", text, flags=re.I), f"{name}: {text!r}"
    table = "\n".join(" | ".join(cells) for cells in _preset_rows(README.read_text(encoding="utf-8")).values())
    assert not re.search(r"\bseed \d", table)

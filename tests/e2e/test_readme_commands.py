"""Docs that run: every command example in README.md and docs/*.md, in order, on a fresh copy of the repository.

The pages are read in the order of DOCS (README first; a command may use what an earlier page's commands
wrote, as the CI page's commands use the quick start's). The commands are the lines (or `&&`-joined parts
of lines) in their ```bash blocks starting with `mpt `, `python examples/` (a bundled script) or `python FILE`
for a FILE a page writes: a ```yaml or ```python block whose first line is `# FILE` (`# mpt.yaml`,
`# tune_digits.py`) is written to the copy's root where it appears, as a user following the page would.
Each command must exit 0; the checks are on exit codes and the files the commands write, never on their
terminal text (which is free to change). Lines that cannot run here are skipped by the reasons in SKIP,
which the test also keeps honest.

The presets table (docs/presets.md) is checked against `tuner.preset_names()` and the presets' list sizes;
README.md's length, the pages' relative links and anchors, and words that mean nothing outside this
project's own build set-up are checked too.
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
# The pages whose commands run, in this order (every docs/*.md must be listed: test_every_docs_page_is_listed).
DOCS = tuple(ROOT / name for name in (
    "README.md", "docs/model-file.md", "docs/metrics.md", "docs/hf.md", "docs/cli.md", "docs/ci.md",
    "docs/python-api.md", "docs/training.md", "docs/distributed.md", "docs/presets.md", "docs/search.md",
    "docs/design.md", "docs/limits.md", "docs/benchmarks.md", "docs/development.md"))
README_MAX_LINES = 150
# Words about one build set-up that mean nothing to a user (issue 35).
LOCAL_WORDS = ("this project's machines", "already on disk", "development VM")

# A command containing one of these is not run here, for the reason given.
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
# Files the pages' commands write, in the order the pages show them.
EXPECTED = ("mpt-out/plan.yaml", "runs/tiny-bert-bf16/plan.yaml", "runs/tiny-bert-tuned/plan.yaml",
            "tune_digits.py", "runs/python/plan.yaml", "ops.json", "runs/sensor/plan.yaml",
            "runs/sensor-fp16/plan.yaml", "runs/digits_sensor/plan.yaml", "check.xml", "lower.txt", "mpt.yaml",
            "mpt/bf16/plan.yaml", "reports/mpt-check.xml")
if "hf:" in SKIP:
    EXPECTED = tuple(f for f in EXPECTED if "tiny-bert" not in f)
WRITTEN = re.compile(r"# ([\w.-]+\.(?:yaml|py))\b")  # the first line of a block that is a file to write


def readme_steps(text: str, written: set[str] | None = None) -> list[tuple[str, str]]:
    """[("run", command) | ("write FILE", content) | ("skip", command)] in the order of `text`; `written`: the
    files earlier pages wrote (updated)."""
    steps: list[tuple[str, str]] = []
    written = set() if written is None else written
    for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M):
        header = WRITTEN.match(body)
        if lang in ("yaml", "python") and header:
            steps.append((f"write {header.group(1)}", body))
            written.add(header.group(1))
        if lang != "bash":
            continue
        for line in body.replace("\\\n", " ").splitlines():  # join continued lines
            for part in (p.strip() for p in line.split(" && ")):
                if any(reason in part for reason in SKIP):
                    steps.append(("skip", part))
                elif part.startswith(("mpt ", "python examples/")) or part.split()[:2] in (
                        ["python", name] for name in written):
                    steps.append(("run", part))
    return steps


def docs_steps() -> list[tuple[str, str]]:
    """readme_steps of every page of DOCS, in that order."""
    written: set[str] = set()
    return [step for page in DOCS for step in readme_steps(page.read_text(encoding="utf-8"), written)]


def docs_text() -> str:
    return "\n".join(page.read_text(encoding="utf-8") for page in DOCS)


def test_readme_steps_are_found():
    steps = docs_steps()
    runs = [s for kind, s in steps if kind == "run"]
    assert runs[0].startswith("mpt tune examples/digits_sensor.py"), "the quick start's tune comes first"
    readme_runs = [s for kind, s in readme_steps(README.read_text(encoding="utf-8")) if kind == "run"]
    for command in ("mpt inspect", "mpt tune", "mpt check", "python tune_digits.py"):  # the README's three paths
        assert any(r.startswith(command) for r in readme_runs), command
    if "hf:" not in SKIP:
        assert any(r.startswith("mpt tune hf:") for r in readme_runs)
    for command in ("mpt inspect", "mpt tune", "mpt check", "mpt presets"):
        assert any(r.startswith(command) for r in runs), command
    assert [kind for kind, _ in steps if kind.startswith("write ")] == ["write tune_digits.py", "write mpt.yaml"]
    assert any(kind == "skip" and "torchrun" in s for kind, s in steps), "SKIP reasons must still match the docs"


def test_every_docs_page_is_listed():
    assert sorted(DOCS) == sorted([README, *(ROOT / "docs").glob("*.md")]), "add the new page to DOCS, in order"


def test_readme_fits_a_screen_or_two():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move the detail into docs/"


def test_docs_say_nothing_about_one_build_setup():
    for page in DOCS:
        text = page.read_text(encoding="utf-8")
        found = [w for w in LOCAL_WORDS if w.lower() in text.lower()]
        assert not found, f"{page.relative_to(ROOT)}: {found}"


def _anchor(heading: str) -> str:
    """GitHub's id for a Markdown heading: lower case, punctuation but `-` and `_` dropped, spaces as `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_relative_links_and_anchors_resolve():
    for page in DOCS:
        text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"\w+://", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            assert dest.exists(), f"{page.relative_to(ROOT)}: {target} is not there"
            if anchor:
                headings = re.findall(r"^#+ (.*)$", dest.read_text(encoding="utf-8"), flags=re.M)
                assert anchor in {_anchor(h) for h in headings}, f"{page.relative_to(ROOT)}: no #{anchor} in {path}"


# Runs the commands as `mpt` does (`mpt_cli.main:main`, the entry point), each in a forked child of one process
# that imported torch, scikit-learn and mpt once: each command still gets its own process (its own
# sys.modules, signal handlers, locks and exit code) without paying ~2 s of imports 20 times. `python FILE ARGS`
# runs FILE as __main__ in such a child, with its folder first on sys.path, as `python` does. Supports the shell
# syntax the docs use (`# comments`, `> FILE`); any other line runs under bash with the installed `mpt`.
# A {"write": FILE, "content": ...} step writes a file the docs show, where they show it.
RUNNER = r"""
import json, os, runpy, shlex, subprocess, sys, time
import torch, sklearn.datasets, sklearn.model_selection  # noqa: F401  (what every command imports)
from mpt_cli.main import main
results = []
for item in json.load(sys.stdin):
    if "write" in item:
        with open(item["write"], "w", encoding="utf-8") as f:
            f.write(item["content"])
        continue
    step = item["run"]
    words = shlex.split(step, comments=True)
    target = None
    if len(words) >= 2 and words[-2] == ">":
        words, target = words[:-2], words[-1]
    log = f"step{len(results)}"
    t0 = time.monotonic()
    script = words[:1] == ["python"] and len(words) >= 2 and words[1].endswith(".py")
    if any(w in ("|", "&&", ";", "<", ">", ">>") for w in words) or not (words[:1] == ["mpt"] or script):
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
                if script:
                    sys.argv = words[1:]
                    sys.path[0] = os.path.dirname(os.path.abspath(words[1]))
                    runpy.run_path(words[1], run_name="__main__")
                else:
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


def _run_steps(steps: list[tuple[str, str]], cwd: Path, logs: Path) -> list[dict]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "COLUMNS": "120", "PYTHONPATH": str(ROOT)}
    logs.mkdir()
    runner = logs / "runner.py"
    runner.write_text(f"import os\nos.chdir({str(cwd)!r})\n"
                      + RUNNER.replace('log = f"step', f'log = {str(logs)!r} + f"/step'))
    items = [{"run": step} if kind == "run" else {"write": kind.removeprefix("write "), "content": step}
             for kind, step in steps if kind != "skip"]
    runs = sum(kind == "run" for kind, _ in steps)
    done = subprocess.run([sys.executable, str(runner)], input=json.dumps(items), capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=COMMAND_TIMEOUT * runs)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.slow
def test_readme_commands_run_in_order(tmp_path):
    pytest.importorskip("sklearn")  # the examples' data
    repo = tmp_path / "repo"
    shutil.copytree(ROOT, repo, ignore=IGNORE)
    t0 = time.monotonic()
    steps = docs_steps()
    results = _run_steps(steps, repo, tmp_path / "logs")
    for r in results:
        logs = "".join(Path(r["log"] + ext).read_text(errors="replace")[-3000:] for ext in (".out", ".err")
                       if Path(r["log"] + ext).is_file())
        assert r["code"] == 0, f"docs command failed (exit {r['code']}): {r['step']}\n{logs}"
    ran = len(results)
    assert ran == sum(kind == "run" for kind, _ in steps) and ran >= 15
    missing = [f for f in EXPECTED if not (repo / f).is_file()]
    assert not missing, f"the docs' commands did not write {missing}"
    assert isinstance(json.loads((repo / "ops.json").read_text()), dict)
    assert (repo / "lower.txt").read_text().split(), "mpt presets --lists-only lower printed no ops"
    print(f"{ran} docs commands in {time.monotonic() - t0:.1f}s: "
          + ", ".join(f"{r['seconds']:.1f}" for r in results))


def _preset_table() -> list[str]:
    """The lines of the presets table (headed `| preset |`), from whichever page of DOCS holds it."""
    lines = docs_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| preset |"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def _preset_rows() -> dict[str, list[str]]:
    rows = {}
    for line in _preset_table():
        m = re.match(r"\| `([\w-]+)` \|(.*)\|\s*$", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in m.group(2).split("|")]
    return rows


def test_docs_presets_table_matches_the_presets():
    rows = _preset_rows()
    assert sorted(rows) == tuner.preset_names()
    header = _preset_table()[0]
    column = [c.strip() for c in header.strip("|").split("|")].index("ops: lower / FP32 / promote") - 1
    for name, cells in rows.items():
        p = load_preset(name)
        counts = tuple(int(n) for n in cells[column].split("/"))
        assert counts == (len(p.lower), len(p.fp32), len(p.promote)), f"the presets table's counts for {name}"


def test_presets_are_described_by_what_they_reproduce():
    for name in tuner.preset_names():
        p = load_preset(name)
        for text in (p.description, p.source):
            assert text and not re.search(r"\bseeds?\b", text, flags=re.I), f"{name}: {text!r}"
    table = "\n".join(" | ".join(cells) for cells in _preset_rows().values())
    assert not re.search(r"\bseed \d", table)

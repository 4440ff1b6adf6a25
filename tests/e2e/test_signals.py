"""Ctrl-C (SIGINT) and SIGTERM during `mpt tune`, in a real subprocess.

The journal keeps every finished trial, no half-written output is left, the
exit code is 130, and `--resume` finishes the run without repeating a
finished evaluation (tests/assets/slow_model.py counts its evaluate() calls
in a side file).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mpt_cli import exitcodes

ROOT = Path(__file__).resolve().parents[2]
SLOW = Path(__file__).parents[1] / "assets" / "slow_model.py"

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")]


def start(out: Path, counter: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "MPT_TEST_COUNT": str(counter), "MPT_TEST_SLEEP": "1.0", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "mpt_cli", "tune", str(SLOW), "--out", str(out), *extra],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def journal(out: Path) -> list[dict]:
    path = out / "journal.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]  # every line must be whole JSON


def evals(out: Path) -> list[str]:
    return [r["key"] for r in journal(out) if r.get("kind") == "eval"]


def calls(counter: Path) -> int:
    return len(counter.read_text().splitlines()) if counter.is_file() else 0


def wait_for_evals(proc: subprocess.Popen, out: Path, n: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"mpt exited early ({proc.returncode}): {proc.communicate()}")
        try:
            if len(evals(out)) >= n:
                return
        except json.JSONDecodeError:
            pass  # a line being written
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"no {n} finished evaluations in {timeout}s")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_keeps_the_journal_and_resume_repeats_nothing(tmp_path, sig):
    out, counter = tmp_path / "out", tmp_path / "calls.txt"
    proc = start(out, counter, "--thorough")
    wait_for_evals(proc, out, 2)  # the baseline + the all-bf16 trial (fails); the next one is running
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == exitcodes.INTERRUPTED, (proc.returncode, stdout, stderr)
    assert "mpt: error: interrupted" in stderr and "--resume" in stderr and "Traceback" not in stderr

    finished = evals(out)  # parses every line: nothing torn
    assert finished[:2] == ["baseline#1", "fp32="] and len(finished) == len(set(finished))
    leftovers = [p.name for p in out.iterdir() if p.name.endswith(".tmp") or p.name.startswith(".mpt-staging")]
    assert not leftovers
    assert not (out / "plan.yaml").exists()  # no plan had passed yet, so there is no best plan to write
    calls_before = calls(counter)
    assert calls_before >= len(finished)

    # Without --resume the folder is refused (it holds a run); with it the run finishes.
    refused = subprocess.run([sys.executable, "-m", "mpt_cli", "tune", str(SLOW), "--out", str(out)], cwd=ROOT,
                             capture_output=True, text=True, env={**os.environ, "MPT_TEST_SLEEP": "0"})
    assert refused.returncode == exitcodes.USAGE and "already holds a run" in refused.stderr

    proc = start(out, counter, "--thorough", "--resume")
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == exitcodes.OK, (stdout, stderr)
    final = evals(out)
    assert final[: len(finished)] == finished and len(final) == len(set(final))
    # Every evaluate() call of the resumed run produced a new journal entry: no finished one was repeated.
    assert calls(counter) - calls_before == len(final) - len(finished)
    report = json.loads((out / "report.json").read_text())
    assert sum(t["from_journal"] for t in report["trials"]) == len(finished)
    assert "[journal]" in stdout

"""mpt ends when its work is done, even when the user's code left a (non-daemon) thread running.

A real `mpt` process (the console script's path: `python -m mpt_cli`): Python would wait for the thread at
exit, forever here, while the run's outputs are written and its folder lock released.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from mpt_cli import exitcodes

ROOT = Path(__file__).resolve().parents[2]
BOUND = 120  # seconds; the thread sleeps an hour

MODEL = textwrap.dedent("""
    import threading
    import time

    import torch
    from torch import nn

    _threads = []


    def build_model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).eval()


    def example_inputs():
        return (torch.ones(3, 4),)


    def evaluate(model):
        if not _threads:  # a prefetch thread that never ends, not a daemon
            _threads.append(threading.Thread(target=time.sleep, args=(3600,), name="prefetch"))
            _threads[0].start()
        with torch.no_grad():
            return 1.0 - 0.0 * float(model(torch.ones(3, 4)).sum())
    """)


def mpt(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mpt_cli", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=BOUND)


def test_a_thread_left_running_by_evaluate_does_not_keep_mpt_alive(tmp_path):
    model = tmp_path / "threads.py"
    model.write_text(MODEL)
    out = tmp_path / "out"
    res = mpt("tune", model, "--out", out, "-q", "--no-latency")
    assert res.returncode == exitcodes.OK, res.stderr
    assert "your code left 1 thread(s) running (prefetch); mpt exits without waiting" in res.stderr
    assert (out / "plan.yaml").is_file() and (out / "model.safetensors").is_file()
    check = mpt("check", out)  # the folder is free and the plan is whole
    assert check.returncode == exitcodes.OK, check.stderr
    again = mpt("tune", model, "--out", out, "-q", "--no-latency", "--resume")  # the lock was released
    assert again.returncode == exitcodes.OK, again.stderr


def test_the_exit_code_is_kept(tmp_path):
    model = tmp_path / "threads.py"
    model.write_text(MODEL.replace("    with torch.no_grad():", "    raise ValueError('bad labels')\n    with torch.no_grad():"))
    res = mpt("tune", model, "--out", tmp_path / "out", "-q", "--no-latency")
    assert res.returncode == exitcodes.USER_CODE, res.stderr  # the run's own code, not 0 from exiting early
    lines = res.stderr.splitlines()
    assert "evaluate raised ValueError: bad labels" in lines[0] and "thread(s) running (prefetch)" in lines[-1]

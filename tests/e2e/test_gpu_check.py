"""benchmarks/gpu_check.sh's documented case on a CPU: a machine with torch and transformers but not mpt (issue 44).

The script installs the project into a temporary folder (`pip install --no-deps --no-build-isolation --target DIR
.`) and puts it on PYTHONPATH. Here a virtual environment without pip sees this one's site-packages (torch,
transformers, ...) through a .pth line, which does not run that folder's own .pth files: the editable install of
mpt is not importable from it, as on a bare machine. `gpu_tune.py --device cpu --shapes tiny` run with that
interpreter and the temporary install must tune and time the forward (its targets are a GPU's: the exit code says
nothing on a CPU). It failed twice: the tune's child lost the temporary install (`No module named 'mpt_cli'`), and
the forward timing could not import the model file (`import hf_llama`).
"""
from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALL = "pip install -q --no-deps --no-build-isolation --target"

pytest.importorskip("transformers")


def _bare_python(where: Path) -> Path:
    """A venv's python that imports this environment's packages but not what its .pth files add (mpt)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    python = where / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    own = subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"], check=True,
                         capture_output=True, text=True, timeout=60).stdout.strip()
    Path(own, "parent-env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return python


def test_gpu_tune_runs_on_a_machine_without_mpt_from_the_scripts_temporary_install(tmp_path):
    assert f'"$PY" -m {INSTALL} "$TARGET" .' in (ROOT / "benchmarks" / "gpu_check.sh").read_text()
    target = tmp_path / "install"
    subprocess.run([sys.executable, "-m", *INSTALL.split(), str(target), "."], cwd=ROOT, check=True, timeout=300)
    python = _bare_python(tmp_path / "bare")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    missing = subprocess.run([python, "-c", "import mpt_cli"], env=env, cwd=tmp_path, capture_output=True,
                             timeout=60)
    if missing.returncode == 0:
        pytest.skip("mpt is installed into this environment's site-packages itself: no bare machine to simulate")
    env.update(PYTHONPATH=str(target), OMP_NUM_THREADS="1")
    args = ["--device", "cpu", "--shapes", "tiny", "--dtypes", "bf16", "--batch", "2", "--tokens", "16",
            "--forward-batch", "2", "--rounds", "1"]
    res = subprocess.run([python, str(ROOT / "benchmarks" / "gpu_tune.py"), *args], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    row = next(line for line in res.stdout.splitlines() if line.startswith("| tiny "))
    assert row.split("|")[3].strip() == "0", res.stdout  # mpt tune's exit
    assert "forward of 2 x 16 tokens, tiny, bf16" in res.stdout and "all-low plan" in res.stdout

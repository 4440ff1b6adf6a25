"""The CLI behaves the same on CPUs with and without fast bf16 kernels.

On a CPU without AVX512-BF16/AMX (or with oneDNN capped by ONEDNN_MAX_CPU_ISA)
`mpt tune` warns that bf16 may be slow. That warning must never come before an
error it does not explain, and `-q` silences it. The CPU is simulated by
replacing the probe, so these tests hold on any machine.
"""
from __future__ import annotations

import pytest

from mpt_cli import exitcodes
from mpt_cli.main import main
from tests.cli.test_bad_input import model_file


@pytest.fixture
def slow_bf16_cpu(monkeypatch):
    import tuner.core.devices

    monkeypatch.setattr(tuner.core.devices, "_fast_lower_dtypes", lambda: set())


def test_the_probe_reports_a_slow_bf16_cpu(slow_bf16_cpu):
    from tuner.core.devices import check_device

    assert "AVX512-BF16" in check_device("cpu", "bf16")


def test_error_is_the_first_line_on_a_slow_bf16_cpu(runner, tmp_path, slow_bf16_cpu):
    path = model_file(tmp_path, {"evaluate": "def evaluate(model):\n    raise ValueError('boom')"})
    res = runner.invoke(main, ["tune", str(path), "--out", str(tmp_path / "out")])
    assert res.exit_code == exitcodes.USER_CODE, res.output
    assert res.stderr.splitlines()[0].startswith("mpt: error: evaluate raised ValueError: boom"), res.stderr
    assert "warning" not in res.stderr


def test_the_speed_warning_comes_before_the_search_once(runner, tmp_path, slow_bf16_cpu):
    """Shown before the first trial's line (the user can stop a slow run at once), not after the search, and
    not again in the summary."""
    res = runner.invoke(main, ["tune", str(model_file(tmp_path)), "--out", str(tmp_path / "a")])
    assert res.exit_code == exitcodes.OK, res.output
    said = "mpt: warning: this CPU has no AVX512-BF16"
    assert res.output.count(said) == 1, res.output
    assert res.output.index(said) < res.output.index("eval   1"), res.output
    assert "(AVX512-BF16" not in res.output and "AVX512-BF16" in (tmp_path / "a" / "report.md").read_text()


def test_quiet_silences_the_speed_warning(runner, tmp_path, slow_bf16_cpu):
    quiet = runner.invoke(main, ["tune", str(model_file(tmp_path)), "--out", str(tmp_path / "b"), "-q"])
    assert quiet.exit_code == exitcodes.OK, quiet.output
    assert "warning" not in quiet.stderr

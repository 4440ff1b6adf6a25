"""`tuner.tune(..., progress=True)` in a real Jupyter kernel: the trial lines and the closing line show in the
cell's output (with ipywidgets installed or not), with no rich warning about ipywidgets, and the result's repr
is one line.
Runs where the `notebook` extra (nbclient, nbformat, ipykernel) is installed; CI does not install it."""
from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

EXAMPLES = Path(__file__).parents[2] / "examples"


def _text(output: dict) -> str:
    if "application/vnd.jupyter.widget-view+json" in output.get("data", {}):
        return ""  # rich's live line, drawn in an ipywidgets Output where ipywidgets is installed
    return output.get("text") or output.get("data", {}).get("text/plain", "")


def test_tune_in_a_notebook_shows_each_trial_and_the_outcome(tmp_path):
    from nbformat.v4 import new_code_cell, new_notebook

    nb = new_notebook(cells=[
        new_code_cell(f"import sys, torch\ntorch.set_num_threads(1)\nsys.path.insert(0, {str(EXAMPLES)!r})\n"
                      "import digits_cnn as ex\nimport tuner"),
        new_code_cell(f"result = tuner.tune(ex.build_model, ex.evaluate, ex.example_inputs, dtype='bf16', "
                      f"tolerance=0.001, out={str(tmp_path / 'out')!r})"),
        new_code_cell("result")])
    # the kernel is this interpreter (ipykernel's own spec), so it imports this checkout's tuner
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": tmp_path}})
    client.execute()
    tune_out = [_text(o) for o in nb.cells[1].outputs]
    shown = "\n".join(tune_out)
    assert "ipywidgets" not in shown and "Warning" not in shown, shown
    evals = [line for line in shown.splitlines() if line.startswith("eval ")]
    assert [int(line.split()[1]) for line in evals] == list(range(1, len(evals) + 1)) and len(evals) >= 3
    assert "baseline 0.9907; target >= 0.9897" in shown
    closing = shown.strip().splitlines()[-1]
    assert closing.startswith("target met: baseline 0.9907 -> tuned 0.9907 (target 0.9897), trial "), closing
    assert closing.endswith(f"op instances in FP32; {len(evals)} evaluations"), closing
    (result,) = [_text(o) for o in nb.cells[2].outputs]
    assert result.startswith("TuneResult(status=MET, ") and "\n" not in result, result
    assert (tmp_path / "out" / "plan.yaml").is_file()

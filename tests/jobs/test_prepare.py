"""tuner.jobs.prepare: a data file whose token ids cannot index the model's vocabulary is bad input (exit 2) naming
the file, found before the model runs, not an index error in the model's own code (exit 4 naming its file)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from mpt_cli import exitcodes
from mpt_cli.main import main

EXAMPLES = Path(__file__).parents[2] / "examples"


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    """The README's tiny BERT folder (vocab_size 500)."""
    pytest.importorskip("transformers")
    spec = importlib.util.spec_from_file_location("tiny_hf_model", EXAMPLES / "tiny_hf_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    folder = tmp_path_factory.mktemp("hf") / "bert"
    module.main(str(folder))
    return folder


@pytest.mark.parametrize("ids, fragment", [
    (torch.full((4, 8), 600), "token id 600, outside the model's vocabulary (0 to 499"),
    (torch.full((4, 8), -1), "token id -1, outside the model's vocabulary"),
    (torch.ones(4, 8), "`input_ids` holds float32 values; token ids are integers"),
], ids=["past-the-vocabulary", "negative", "float"])
@pytest.mark.parametrize("with_mask", [True, False], ids=["named", "one-tensor"])
def test_token_ids_the_vocabulary_cannot_hold_are_bad_data(bert, tmp_path, ids, fragment, with_mask):
    from safetensors.torch import save_file

    data = tmp_path / "bad.safetensors"
    save_file({"input_ids": ids, **({"attention_mask": torch.ones(4, 8, dtype=torch.long)} if with_mask else {})},
              str(data))
    res = CliRunner().invoke(main, ["tune", f"hf:{bert}", "--data", str(data), "--out", str(tmp_path / "o"), "-q"])
    assert res.exit_code == exitcodes.USAGE, res.output
    assert res.stderr.startswith(f"mpt: error: --data: {data}: ") and fragment in res.stderr, res.stderr
    assert "modeling_" not in res.stderr and not (tmp_path / "o").exists()

"""`mpt tune hf:DIR --save-pretrained SAVED`: a Hugging Face folder that loads back with the plan in one call."""
from __future__ import annotations

import shutil
import sys

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

import tuner
from mpt_cli import exitcodes
from tests.cli.test_bad_input import assert_error, mpt
from tests.conftest import EXAMPLES
from tuner.core.errors import ConfigError, OutputError
from tuner.report import pretrained

transformers = pytest.importorskip("transformers")


def _tiny_hf_model():
    import importlib.util

    spec = importlib.util.spec_from_file_location("tiny_hf_model", EXAMPLES / "tiny_hf_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The README's tiny BERT folder (with a tokenizer file) tuned with --save-pretrained: (DIR, OUT, SAVED)."""
    root = tmp_path_factory.mktemp("save")
    _tiny_hf_model().main(str(root / "bert"))
    (root / "bert" / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    res = mpt(CliRunner(), "tune", f"hf:{root / 'bert'}", "--data", root / "bert" / "calibration.safetensors",
              "--out", root / "out", "--save-pretrained", root / "saved", "--no-latency", "--tolerance", "0.5")
    assert res.exit_code in (0, 3), res.output
    assert f'tuner.load("hf:{root / "saved"}")' in res.stdout.splitlines()[-1]
    return root / "bert", root / "out", root / "saved"


def _logits(model, folder):
    with torch.no_grad():
        return model(**load_file(str(folder / "calibration.safetensors"))).logits


def test_the_saved_folder_loads_with_its_plan_bit_for_bit_and_from_pretrained_loads_its_weights(run):
    source, out, saved = run
    expected = _logits(tuner.load(f"hf:{source}", out), source)
    model = tuner.load(f"hf:{saved}")  # the plan and checkpoint found in the folder
    assert tuner.attached(model) is not None
    assert torch.equal(_logits(model, source), expected)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16, torch.float32}  # lowered as stored
    assert (saved / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
    assert (saved / "vocab.txt").is_file() and not (saved / "calibration.safetensors").exists()
    assert pretrained.is_saved_folder(saved)
    plain = transformers.BertForMaskedLM.from_pretrained(str(saved), dtype="auto")  # weights only, all FP32
    stored = load_file(str(saved / "model.safetensors"))
    assert all(p.dtype == torch.float32 and torch.equal(p, stored[n].float()) for n, p in plain.named_parameters())
    assert tuner.attached(plain) is None
    assert torch.equal(_logits(tuner.load(plain), source), expected)  # its plan found by name_or_path
    with pytest.raises(ConfigError, match="holds no plan.yaml"):
        tuner.load(f"hf:{source}")


def test_refused_before_anything_is_written(run, tmp_path, monkeypatch):
    source, _, saved = run
    data = source / "calibration.safetensors"
    runner = CliRunner()
    res = mpt(runner, "tune", EXAMPLES / "digits_sensor.py", "--save-pretrained", tmp_path / "s", "--out",
              tmp_path / "o", "-q")
    assert_error(res, exitcodes.USAGE, "--save-pretrained", "hf:DIR model")
    config = f"version: 1\nmodel: {EXAMPLES / 'digits_sensor.py'}\nsave_pretrained: {tmp_path / 's'}\n"
    (tmp_path / "cfg.yaml").write_text(config)  # the config key is the flag's
    assert_error(mpt(runner, "tune", "--config", tmp_path / "cfg.yaml", "-q"), exitcodes.USAGE, "hf:DIR model")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "config.json").write_text("{}")
    cases = {theirs: "mpt did not write", saved: "already holds a model mpt saved; pass --overwrite",
             tmp_path / "o" / "s": "overlap"}
    for folder, fragment in cases.items():
        res = mpt(runner, "tune", f"hf:{source}", "--data", data, "--out", tmp_path / "o", "--save-pretrained",
                  folder, "-q")
        assert_error(res, exitcodes.USAGE, "--save-pretrained", fragment)
        assert not (tmp_path / "o").exists()
    assert (theirs / "config.json").read_text() == "{}" and pretrained.is_saved_folder(saved)
    sentence = tmp_path / "st"
    shutil.copytree(source, sentence)
    (sentence / "modules.json").write_text("[]")
    monkeypatch.setitem(sys.modules, "sentence_transformers", type(sys)("sentence_transformers"))
    res = mpt(runner, "tune", f"hf:{sentence}", "--data", data, "--out", tmp_path / "o", "--save-pretrained",
              tmp_path / "s", "-q")
    assert_error(res, exitcodes.USAGE, "--save-pretrained", "sentence-transformers folder")
    assert not (tmp_path / "o").exists()


def test_a_failed_write_leaves_nothing_and_a_replaced_folder_as_it_was(run, tmp_path, monkeypatch):
    source, out, saved = run
    model = transformers.BertForMaskedLM.from_pretrained(str(source))
    old = tmp_path / "old"
    shutil.copytree(saved, old)
    before = sorted((p.name, p.read_bytes()) for p in old.iterdir())
    monkeypatch.setattr(pretrained, "_copy_hashed", _disk_full)
    for target in (tmp_path / "new", old):
        with pytest.raises(OutputError, match="No space left"):
            pretrained.save_pretrained_folder(model, source, out, target, replace=True)
    assert not (tmp_path / "new").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["old"]
    assert sorted((p.name, p.read_bytes()) for p in old.iterdir()) == before
    monkeypatch.undo()
    (old / "plan.yaml").write_text("changed\n")  # no longer what mpt wrote: never replaced
    with pytest.raises(ConfigError, match="mpt did not write"):
        pretrained.save_pretrained_folder(model, source, out, old, replace=True)


def _disk_full(source, target):
    target.write_bytes(b"partial")
    raise OSError(28, "No space left on device")


def test_the_readme_tiny_model_script_prints_no_progress_bar_after_its_last_line(tmp_path, capfd):
    """transformers' "Writing model shards" bar (stderr) came after the script's `wrote DIR/` line."""
    from transformers.utils import logging as hf_logging

    try:
        _tiny_hf_model().main(str(tmp_path / "bert"))
        out, err = capfd.readouterr()
    finally:
        hf_logging.enable_progress_bar()  # as other tests expect it
    assert out.startswith("wrote ") and "Writing model shards" not in err and "it/s" not in err

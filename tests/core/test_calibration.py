"""Calibration batches from each kind of source: .safetensors, .pt, .jsonl texts, the user's functions."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from tuner.core.calibration import data_file, function_batches
from tuner.core.errors import ConfigError
from tuner.core.inputs import ModelInputs


def test_safetensors_is_cut_into_keyword_batches(tmp_path):
    ids = torch.arange(50).reshape(10, 5)
    save_file({"input_ids": ids, "attention_mask": torch.ones(10, 5, dtype=torch.long)}, tmp_path / "d.safetensors")
    batches = list(data_file(str(tmp_path / "d.safetensors"), batch_size=4, tokenizer=None).batches())
    assert [b.kwargs["input_ids"].shape[0] for b in batches] == [4, 4, 2]
    assert torch.equal(torch.cat([b.kwargs["input_ids"] for b in batches]), ids)


def test_one_tensor_is_the_positional_argument(tmp_path):
    x = torch.randn(5, 3)
    save_file({"x": x}, tmp_path / "x.safetensors")
    batches = list(data_file(str(tmp_path / "x.safetensors"), batch_size=8, tokenizer=None).batches())
    assert len(batches) == 1 and torch.equal(batches[0].args[0], x) and not batches[0].kwargs


def test_pt_tensor_dict_and_list_of_batches(tmp_path):
    torch.save(torch.randn(6, 2), tmp_path / "t.pt")
    assert [b.args[0].shape[0] for b in data_file(str(tmp_path / "t.pt"), batch_size=4, tokenizer=None).batches()] \
        == [4, 2]
    torch.save({"a": torch.randn(3, 2), "b": torch.randn(3)}, tmp_path / "d.pt")
    (batch,) = data_file(str(tmp_path / "d.pt"), batch_size=8, tokenizer=None).batches()
    assert set(batch.kwargs) == {"a", "b"}
    torch.save([(torch.randn(2, 2),), {"x": torch.randn(1, 2)}], tmp_path / "l.pt")
    listed = list(data_file(str(tmp_path / "l.pt"), batch_size=8, tokenizer=None).batches())
    assert len(listed) == 2 and listed[0].args[0].shape == (2, 2) and "x" in listed[1].kwargs


def test_bad_data_files_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="file not found: nope.pt"):
        data_file("nope.pt", batch_size=8, tokenizer=None)
    (tmp_path / "d.csv").write_text("1,2\n")
    with pytest.raises(ConfigError, match="is not one of"):
        data_file(str(tmp_path / "d.csv"), batch_size=8, tokenizer=None)
    save_file({"a": torch.zeros(3, 2), "b": torch.zeros(4, 2)}, tmp_path / "m.safetensors")
    with pytest.raises(ConfigError, match="share their first"):
        data_file(str(tmp_path / "m.safetensors"), batch_size=8, tokenizer=None).first()
    (tmp_path / "t.jsonl").write_text('"a text"\n')
    with pytest.raises(ConfigError, match="--tokenizer"):
        data_file(str(tmp_path / "t.jsonl"), batch_size=8, tokenizer=None)


def test_jsonl_texts_are_tokenized_per_batch(tmp_path):
    transformers = pytest.importorskip("transformers")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat"]))
    transformers.BertTokenizerFast(vocab_file=str(vocab)).save_pretrained(tmp_path / "tok")
    lines = ['"the cat sat"', json.dumps({"text": "the cat sat on the mat"}), "", '"cat"']
    (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n")
    batches = list(data_file(str(tmp_path / "t.jsonl"), batch_size=2, tokenizer=str(tmp_path / "tok")).batches())
    assert [b.kwargs["input_ids"].shape[0] for b in batches] == [2, 1]
    assert batches[0].kwargs["attention_mask"].sum(dim=1).tolist() == [5, 8]  # [CLS] ... [SEP], padded to 8


def test_every_bad_jsonl_line_is_reported_before_any_batch_is_made(tmp_path):
    """All bad lines counted, the first few listed, when the file is given (not when a batch reaches line 40),
    and a folder with no tokenizer is bad input too, with no tokenizer ever loaded for a bad file."""
    lines = ['"ok"'] * 40 + ["{not json", "3", json.dumps({"txt": "x"}), "[1]", "null", "true", '"ok"', "oops"]
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "tok").mkdir()
    with pytest.raises(ConfigError) as caught:
        data_file(str(tmp_path / "bad.jsonl"), batch_size=2, tokenizer=str(tmp_path / "tok"))
    assert str(caught.value) == ('data: bad.jsonl: 7 lines of 48 are not a text (lines 41, 42, 43, 44, 45, ...): '
                                 'write one JSON string or object with a "text" string per line')
    pytest.importorskip("transformers")
    (tmp_path / "good.jsonl").write_text('"ok"\n')
    with pytest.raises(ConfigError, match=r"^tokenizer: cannot load a tokenizer from .*tok .*tokenizer.json"):
        data_file(str(tmp_path / "good.jsonl"), batch_size=2, tokenizer=str(tmp_path / "tok"))


def test_a_data_file_is_checked_whole_when_given(tmp_path):
    """A damaged .safetensors, token tensors of two lengths, and tensors the forward does not take: each a
    ConfigError naming the file and the fix, before any batch is read."""
    (tmp_path / "bad.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(ConfigError, match=r"^data: cannot read bad.safetensors as safetensors \(SafetensorError: .*"
                                          r"header too large\): .*save_file"):
        data_file(str(tmp_path / "bad.safetensors"), batch_size=8, tokenizer=None)
    save_file({"input_ids": torch.ones(8, 10, dtype=torch.long), "attention_mask": torch.ones(8, 12)},
              tmp_path / "m.safetensors")
    with pytest.raises(ConfigError, match=r"token tensors of m.safetensors disagree in shape \(attention_mask "
                                          r"\[8, 12\], input_ids \[8, 10\]\).*one tokenizer call"):
        data_file(str(tmp_path / "m.safetensors"), batch_size=8, tokenizer=None)
    torch.save([{"input_ids": torch.ones(2, 3), "attention_mask": torch.ones(2, 4)}], tmp_path / "l.pt")
    with pytest.raises(ConfigError, match=r"l.pt \(batch 0\) disagree in shape"):
        data_file(str(tmp_path / "l.pt"), batch_size=8, tokenizer=None)
    (tmp_path / "x.pt").write_bytes(b"not a torch file")
    with pytest.raises(ConfigError, match=r"^data: cannot read x.pt as tensors"):
        data_file(str(tmp_path / "x.pt"), batch_size=8, tokenizer=None)
    save_file({"foo": torch.ones(4, 3), "bar": torch.ones(4, 3)}, tmp_path / "n.safetensors")
    named = data_file(str(tmp_path / "n.safetensors"), batch_size=8, tokenizer=None)

    def forward(input_ids, attention_mask=None, **flags):
        return input_ids

    with pytest.raises(ConfigError, match=r"n.safetensors holds 2 tensors bar, foo, which M.forward does not take "
                                          r"\(it takes input_ids, attention_mask\): name each tensor"):
        named.check_forward(forward, owner="M.forward", strict=True)
    named.check_forward(forward, owner="M.forward")  # **kwargs of a model file's forward: it may take them
    named.check_forward(lambda **features: features, owner="E.forward", strict=True)  # takes only **kwargs


def test_function_batches_convert_each_batch_and_refuse_none():
    calls = []
    cal = function_batches(lambda: [torch.ones(1), torch.zeros(1)], "calibration_batches",
                           lambda b: calls.append(b) or ModelInputs.of(b))
    assert len(list(cal.batches())) == 2 and len(calls) == 2
    with pytest.raises(ConfigError, match="holds no batch"):
        list(function_batches(lambda: [], "calibration_batches", ModelInputs.of).batches())

"""`mpt tune hf:DIR`: a saved Hugging Face folder tuned and checked with no model file."""
from __future__ import annotations

import json
import sys

import pytest
import torch
import yaml
from safetensors.torch import save_file

from mpt_cli import exitcodes
from tuner import attached as tuner_attached
from tuner import load as tuner_load
from tuner.core.errors import ConfigError
from tests.cli.test_bad_input import assert_error, mpt

transformers = pytest.importorskip("transformers")


def _config(**extra):
    return transformers.BertConfig(vocab_size=200, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=64, max_position_embeddings=32, **extra)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny BertForSequenceClassification and BertForMaskedLM folder, and token batches for both."""
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(_config(num_labels=3)).save_pretrained(root / "cls")
    transformers.BertForMaskedLM(_config()).save_pretrained(root / "mlm")
    transformers.BertModel(_config()).save_pretrained(root / "enc")
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 200, (12, 10), generator=g)
    mask = torch.ones_like(ids)
    mask[::2, 7:] = 0
    save_file({"input_ids": ids, "attention_mask": mask}, root / "data.safetensors")
    return root


def test_tune_then_check_a_saved_classifier_with_no_model_file(runner, saved, tmp_path):
    out = tmp_path / "out"
    res = mpt(runner, "tune", f"hf:{saved / 'cls'}", "--metric", "agreement", "--data", saved / "data.safetensors",
              "--out", out, "-q", "--no-latency")
    assert res.exit_code == 0, res.output
    plan = yaml.safe_load((out / "plan.yaml").read_text())
    assert plan["model"]["file"].startswith("hf:") and plan["model"]["metric"] == "agreement"
    assert plan["metrics"]["baseline"] == 1.0
    check = mpt(runner, "check", out, "--json")
    assert check.exit_code == 0, check.output
    assert json.loads(check.stdout)["passed"] is True
    report = (out / "report.md").read_text()
    assert "| # | what changed | metric | result | in bf16 |" in report
    snippet = report.split("```python\n")[1].split("```")[0]  # report.md's load snippet runs as written
    assert "build_model" not in snippet and "BertForSequenceClassification.from_pretrained" in snippet
    scope: dict = {}
    exec(snippet, scope)  # noqa: S102
    assert tuner_attached(scope["model"]) is not None


def test_default_metric_follows_the_head_and_inspect_takes_data(runner, saved, tmp_path):
    res = mpt(runner, "tune", f"hf:{saved / 'mlm'}", "--data", saved / "data.safetensors", "--out", tmp_path / "m",
              "-q", "--no-latency", "--max-evals", "4")
    assert res.exit_code in (0, 3), res.output
    assert yaml.safe_load((tmp_path / "m" / "plan.yaml").read_text())["model"]["metric"] == "agreement"
    res = mpt(runner, "tune", f"hf:{saved / 'enc'}", "--data", saved / "data.safetensors", "--out", tmp_path / "e",
              "-q", "--no-latency", "--max-evals", "4")
    assert res.exit_code in (0, 3), res.output
    ref = yaml.safe_load((tmp_path / "e" / "plan.yaml").read_text())["model"]
    assert ref["metric"] == "cosine"
    res = mpt(runner, "inspect", f"hf:{saved / 'enc'}", "--data", saved / "data.safetensors", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["summary"]["lower_flop_share"] > 0


def test_hf_bad_inputs(runner, saved, tmp_path, monkeypatch):
    data = saved / "data.safetensors"
    res = mpt(runner, "tune", f"hf:{tmp_path / 'none'}", "--data", data, "--out", tmp_path / "o", "-q")
    assert_error(res, exitcodes.USAGE, "model folder not found")
    res = mpt(runner, "tune", f"hf:{saved / 'cls'}", "--out", tmp_path / "o", "-q")
    assert_error(res, exitcodes.USAGE, "hf: model needs calibration inputs", "--data")
    res = mpt(runner, "tune", f"hf:{saved / 'cls'}", "--data", data, "--output", "pooler_output",
              "--out", tmp_path / "o", "-q")
    assert_error(res, exitcodes.USAGE, "--output", "'pooler_output'", "logits")
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    res = mpt(runner, "tune", f"hf:{saved / 'cls'}", "--data", data, "--out", tmp_path / "p", "-q")
    assert_error(res, exitcodes.USAGE, "pip install", "transformers", "torch==")


def test_bad_data_files_are_exit_2_naming_the_file_before_out_is_claimed(runner, saved, tmp_path):
    """A damaged file, tensors the class's forward does not take, token tensors of two lengths, a .jsonl with
    bad lines (all counted): one `mpt: error: --data:` line each, and no output folder made to refuse a rerun."""
    ids = torch.randint(1, 200, (8, 10))
    save_file({"foo": ids, "bar": torch.ones_like(ids)}, tmp_path / "names.safetensors")
    save_file({"input_ids": ids, "attention_mask": torch.ones(8, 12, dtype=torch.long)},
              tmp_path / "shapes.safetensors")
    (tmp_path / "damaged.safetensors").write_bytes(b"\xff" * 64)
    (tmp_path / "texts.jsonl").write_text('"fine"\n{not json\n"fine"\n3\n{"txt": "x"}\n')
    expected = {"damaged.safetensors": "cannot read damaged.safetensors as safetensors",
                "names.safetensors": "holds 2 tensors bar, foo, which BertForSequenceClassification.forward does "
                                     "not take (it takes input_ids, attention_mask,",
                "shapes.safetensors": "(attention_mask [8, 12], input_ids [8, 10]): attention_mask, input_ids must "
                                      "share one shape",
                "texts.jsonl": "texts.jsonl: 3 lines of 5 are not a text (lines 2, 4, 5)"}
    for name, fragment in expected.items():
        out = tmp_path / f"out-{name}"
        res = mpt(runner, "tune", f"hf:{saved / 'cls'}", "--data", tmp_path / name, "--out", out, "-q")
        err = assert_error(res, exitcodes.USAGE, "mpt: error: --data: ", fragment)
        assert len(err.strip().splitlines()) == 1, err
        assert not out.exists(), name


class _Transformer(torch.nn.Module):
    """sentence-transformers' Transformer module: the folder's HF model as `.model`, its forward taking one dict."""

    def __init__(self, folder):
        super().__init__()
        self.model = transformers.AutoModel.from_pretrained(str(folder))

    def forward(self, features):
        hidden = self.model(input_ids=features["input_ids"], attention_mask=features["attention_mask"])
        return {**features, "token_embeddings": hidden.last_hidden_state}


class _MeanPooling(torch.nn.Module):
    def forward(self, features):
        mask = features["attention_mask"].unsqueeze(-1).to(features["token_embeddings"].dtype)
        return {**features, "sentence_embedding": (features["token_embeddings"] * mask).sum(1) / mask.sum(1)}


class _SentenceTransformer(torch.nn.Sequential):
    """The module tree sentence-transformers (not installed in CI) builds from a modules.json folder, with
    the same names (`0.model.embeddings...`): what `mpt tune hf:DIR` tunes, wrapped, when the package is there."""

    def __init__(self, folder, device="cpu", local_files_only=True):
        super().__init__(_Transformer(folder), _MeanPooling())


def _sentence_folder(root):
    """A sentence-transformers folder as its `save` writes one: the transformer at the top, then modules.json."""
    folder = root / "st"
    transformers.BertModel(_config()).save_pretrained(folder)
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text('{"word_embedding_dimension": 32}')
    return folder


def _snippet(out):
    scope: dict = {}
    exec((out / "report.md").read_text().split("```python\n")[1].split("```")[0], scope)
    return scope["model"]


def test_a_sentence_transformers_run_loads_by_its_folder_and_into_the_users_own_objects(runner, saved, tmp_path,
                                                                                      monkeypatch):
    folder, out = _sentence_folder(tmp_path), tmp_path / "out"
    monkeypatch.setitem(sys.modules, "sentence_transformers",
                        type(sys)("sentence_transformers", "stand-in"))
    sys.modules["sentence_transformers"].SentenceTransformer = _SentenceTransformer
    # tolerance 1e-12: all-bf16 moves the embedding's cosine by about 1.6e-9, so at 1e-9 it failed by 0.6 of a
    # tolerance; the plan keeps something FP32 (what the islands below need) only where all-bf16 fails on any CPU
    res = mpt(runner, "tune", f"hf:{folder}", "--data", saved / "data.safetensors", "--out", out, "-q",
              "--no-latency", "--tolerance", "1e-12", "--max-evals", "5")
    assert res.exit_code in (0, 3), res.output
    plan = yaml.safe_load((out / "plan.yaml").read_text())
    assert all(i["module"].startswith("model.0.model.") for i in plan["fp32_instances"]) and plan["fp32_instances"]
    batch = {"input_ids": torch.randint(1, 200, (3, 8)), "attention_mask": torch.ones(3, 8, dtype=torch.long)}
    model = _snippet(out)  # report.md's line: tuner.load("hf:DIR", OUT) gives the SentenceTransformer
    assert isinstance(model, _SentenceTransformer) and tuner_attached(model) is not None
    islands = {i["module"][len("model."):] for i in plan["fp32_instances"]}
    assert islands <= set(tuner_attached(model).fp32_islands)  # the plan's FP32 ops, on the user's names
    expected = model(batch)
    own = tuner_load(_SentenceTransformer(folder), out)
    assert torch.equal(own(batch)["sentence_embedding"], expected["sentence_embedding"])
    encoder = tuner_load(transformers.AutoModel.from_pretrained(str(folder)), out)  # PlanMismatchError before
    assert torch.equal(encoder(**batch).last_hidden_state, expected["token_embeddings"])
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # loaded where the package is not installed
    bare = tuner_load(f"hf:{folder}", out)
    assert isinstance(bare, transformers.BertModel)
    assert torch.equal(bare(**batch).last_hidden_state, expected["token_embeddings"])


def test_an_hf_run_loads_back_by_its_folder_as_report_md_prints_it_and_is_titled_by_it(runner, saved, tmp_path):
    out = tmp_path / "out"
    res = mpt(runner, "tune", f"hf:{saved / 'mlm'}", "--data", saved / "data.safetensors", "--out", out, "-q",
              "--no-latency", "--max-evals", "2")
    assert res.exit_code in (0, 3), res.output
    report = (out / "report.md").read_text()
    assert f'tuner.load("hf:{saved / "mlm"}", "{out}")' in report
    title = f"mpt tune: <code>hf:{saved.name}/mlm</code> in bf16"  # the folder and its parent, not `model`
    assert report.startswith(f"### mpt tune: `hf:{saved.name}/mlm` in bf16")
    assert title in (out / "search.html").read_text()
    model = _snippet(out)
    assert isinstance(model, transformers.BertForMaskedLM) and tuner_attached(model) is not None
    with pytest.raises(ConfigError, match="hf:DIR"):
        tuner_load(str(saved / "mlm"), out)  # a folder without hf: is refused, naming the form that works

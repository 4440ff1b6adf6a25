"""tuner.workspace.modelref: which model a plan was made for, recorded relative to the plan's folder and resolved back."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tuner.core.errors import ConfigError
from tuner.core.fingerprint import structure_digest
from tuner.core.loader import load_user_model
from tuner.workspace.modelref import model_ref_for, resolve_model_ref
from tuner.policy.plan import ModelRef

MODEL = (Path(__file__).parents[1] / "assets" / "valid_model.py").read_text()


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "model.py").write_text(MODEL + "\n\ndef make():\n    return build_model()\n")
    (tmp_path / "src" / "metrics.py").write_text("def score(model):\n    return 1.0\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_paths_are_relative_to_the_output_folder(repo):
    user = load_user_model("src/model.py:make", eval="metrics.py:score", inputs="example_inputs")
    ref = model_ref_for(user, repo / "runs" / "bf16", build=None, eval="metrics.py:score", inputs="example_inputs")
    assert ref.file == "../../src/model.py"
    assert ref.build == "make"  # picked as MODEL.py:NAME
    assert ref.eval == "../../src/metrics.py:score"  # found beside the model file, as the loader finds it
    assert ref.inputs == "example_inputs" and (ref.structure, ref.weights, ref.source) == ("", "", "")


def test_no_common_folder_but_the_root_stays_absolute(repo):
    user = load_user_model("src/model.py")
    ref = model_ref_for(user, Path(os.sep) / "mpt-elsewhere" / "out", build=None, eval=None, inputs=None)
    assert ref.file == (repo / "src" / "model.py").resolve().as_posix() and ref.build is None


def test_digests_when_the_model_is_given(repo):
    user = load_user_model("src/model.py", eval="metrics.py:score")
    model = user.build()
    ref = model_ref_for(user, repo / "out", build=None, eval="metrics.py:score", inputs=None, model=model)
    assert ref.structure == structure_digest(model) and len(ref.weights) == len(ref.source) == 64
    plain = load_user_model("src/model.py")
    other = model_ref_for(plain, repo / "out", build=None, eval=None, inputs=None, model=model)
    assert other.source != ref.source  # metrics.py counts among the user's files
    ref.check_structure(user.build())


def test_resolve_relative_to_the_plan_folder(repo):
    ref = ModelRef(file="../../src/model.py", build="make", eval="../../src/metrics.py:score")
    plan_dir = repo / "runs" / "bf16"
    model, build, evaluate, inputs = resolve_model_ref(ref, plan_dir)
    assert Path(model) == repo / "src" / "model.py" and build == "make" and inputs is None
    assert evaluate == str(repo / "src" / "metrics.py") + ":score"
    assert resolve_model_ref(ref, plan_dir, file="other.py")[0] == "other.py"


def test_every_missing_file_is_named(repo):
    ref = ModelRef(file="../model.py", eval="../gone.py:score")
    with pytest.raises(ConfigError) as info:
        resolve_model_ref(ref, repo / "runs")
    assert info.value.fields == ("model", "eval")
    assert "was made for ../model.py (the model file), which is not there" in info.value.errors[0]
    assert "../gone.py (the eval function's file)" in info.value.errors[1]

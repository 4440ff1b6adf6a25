"""tuner.core.sharding on models that are not sharded (the sharded ones run under torchrun:
tests/search/test_sharded.py), and the folder digest a sharded checkpoint is recorded by."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from tuner.core.errors import ConfigError
from tuner.core.fingerprint import sha256_file, structure_digest, tree_sha256, weights_digest
from tuner.core.sharding import Sharding, class_name, is_dtensor, local_tensor, placements


def test_an_unsharded_model_reads_as_not_sharded_and_keeps_its_digests():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    sharding = Sharding.of(model)
    assert not sharding.sharded and sharding.describe() == "not sharded"
    w = model[0].weight
    assert not is_dtensor(w) and local_tensor(w) is w and placements(w) == ""
    assert class_name(model[0]) == "Linear"
    # a plain model's digests are what they were before sharded models were read: old journals still resume
    assert weights_digest(model) == weights_digest(model) and len(structure_digest(model)) == 64


def test_a_pipeline_parallel_model_is_refused_in_one_line():
    Stage = type("Stage", (nn.Module,), {"__module__": "torch.distributed.pipelining._IR"})
    model = nn.Sequential(Stage())
    with pytest.raises(ConfigError, match="pipeline-parallel model .* FSDP2 or tensor parallelism"):
        Sharding.of(model)


def test_tree_sha256_names_every_file_of_a_folder(tmp_path):
    (tmp_path / "one.bin").write_bytes(b"a")
    assert tree_sha256(tmp_path / "one.bin") == sha256_file(tmp_path / "one.bin")
    folder = tmp_path / "model.dcp"
    folder.mkdir()
    (folder / ".metadata").write_bytes(b"m")
    (folder / "__0_0.distcp").write_bytes(torch.arange(4).numpy().tobytes())
    before = tree_sha256(folder)
    (folder / "__1_0.distcp").write_bytes(b"")  # a rank's file more, even empty, is another checkpoint
    assert tree_sha256(folder) != before
    (folder / "__1_0.distcp").unlink()
    assert tree_sha256(folder) == before
    (folder / "__0_0.distcp").write_bytes(b"x")
    assert tree_sha256(folder) != before

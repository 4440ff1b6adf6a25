"""Nothing mpt did not write is ever overwritten: user files in `--out` survive every flag combination.

Each case runs `mpt tune` through the CLI on a tiny real model. A file under one of
mpt's output names that is not in the folder's manifest (or whose content is not
what mpt wrote) is refused with exit 2 naming it, and left byte for byte.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mpt_cli import exitcodes
from mpt_cli.main import main
from tuner.core.output_files import (
    CHECKPOINT_NAME,
    COMMITTED,
    MANIFEST_NAME,
    OUTPUT_FILES,
    PLAN_NAME,
    REPORT_MD_NAME,
    STAGING_NAME,
)

MODEL = Path(__file__).parents[1] / "assets" / "valid_model.py"
FLAGS = [(), ("--resume",), ("--overwrite",)]


def tune(runner, out: Path, *flags: str):
    res = runner.invoke(main, ["tune", str(MODEL), "--out", str(out), "-q", "--no-latency", *flags])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    return res


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.name != ".mpt.lock"}


def assert_refused(res, path: Path, *why: str) -> None:
    """Refused with exit 2 naming `path` and one of `why` (default: "mpt did not write")."""
    assert res.exit_code == exitcodes.USAGE, res.output
    first = res.stderr.splitlines()[0]
    assert first.startswith("mpt: error: ") and str(path) in first, first
    assert any(w in first for w in why or ("mpt did not write",)), first
    assert "--resume" not in res.stderr  # never the advice that would overwrite it
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("flags", FLAGS, ids=["plain", "resume", "overwrite"])
def test_the_users_own_weights_in_out_survive(runner, tmp_path, flags):
    out = tmp_path / "out"
    out.mkdir()
    weights = out / CHECKPOINT_NAME
    weights.write_bytes(b"the user's FP32 weights" * 100)
    res = tune(runner, out, *flags)
    assert_refused(res, weights)
    assert weights.read_bytes() == b"the user's FP32 weights" * 100
    assert not (out / PLAN_NAME).exists()


@pytest.mark.parametrize("flags", FLAGS, ids=["plain", "resume", "overwrite"])
@pytest.mark.parametrize("name", OUTPUT_FILES)
def test_a_user_file_replacing_one_of_mpts_outputs_survives(runner, tmp_path, name, flags):
    out = tmp_path / "out"
    assert tune(runner, out).exit_code == exitcodes.OK
    (out / name).write_bytes(b"mine, not mpt's\n")  # the user put their own file under that name
    before = snapshot(out)
    res = tune(runner, out, *flags)
    assert_refused(res, out / name, "mpt did not write", "changed since")  # one it wrote: replaced or edited
    assert snapshot(out) == before  # nothing replaced or deleted, the manifest included


@pytest.mark.parametrize("flags", FLAGS, ids=["plain", "resume", "overwrite"])
def test_files_under_other_names_are_never_touched(runner, tmp_path, flags):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    (out / "weights.pt").write_bytes(b"\x00" * 64)
    assert tune(runner, out, *flags).exit_code == exitcodes.OK
    assert (out / "notes.txt").read_text() == "keep me" and (out / "weights.pt").read_bytes() == b"\x00" * 64
    again = tune(runner, out, *(flags or ("--overwrite",)))
    assert again.exit_code == exitcodes.OK, again.output
    assert (out / "notes.txt").read_text() == "keep me" and (out / "weights.pt").read_bytes() == b"\x00" * 64


def test_mpts_own_outputs_are_listed_with_their_digests_and_replaced_by_either_flag(runner, tmp_path):
    from tuner.core.fingerprint import sha256_file

    out = tmp_path / "out"
    assert tune(runner, out).exit_code == exitcodes.OK
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    for name in COMMITTED:
        if name in ("model.dcp", "hmp_ops_fp16.txt"):  # a sharded model's checkpoint (tests/search/test_sharded.py),
            assert name not in manifest["files"] and not (out / name).exists()  # an fp16 plan's HMP list
            continue
        assert manifest["files"][name] == {"sha256": sha256_file(out / name)}
    assert "head_sha256" in manifest["files"]["journal.jsonl"] and manifest["staging"] == []
    for flags in (("--resume",), ("--overwrite",)):
        assert tune(runner, out, *flags).exit_code == exitcodes.OK
    plain = tune(runner, out)
    assert plain.exit_code == exitcodes.USAGE and "already holds a run" in plain.stderr  # mpt's own run


@pytest.mark.parametrize("name", [PLAN_NAME, REPORT_MD_NAME])
def test_an_output_edited_by_the_user_is_not_replaced_and_is_called_edited(runner, tmp_path, name):
    """An edited report.md is mpt's file changed since, not "a file mpt did not write" (docs/cli.md: never
    replaced or deleted, the run stops naming it)."""
    out = tmp_path / "out"
    assert tune(runner, out).exit_code == exitcodes.OK
    edited = (out / name).read_text() + "# my notes\n"
    (out / name).write_text(edited)
    for flags in FLAGS:
        res = tune(runner, out, *flags)
        assert_refused(res, out / name, "which mpt wrote but which changed since")
        assert "mpt did not write" not in res.stderr
    assert (out / name).read_text() == edited


KILL_DURING_COMMIT = """
import os, sys
import tuner.report.writer as writer
real, out = os.replace, os.path.abspath(sys.argv[2])
def replace(src, dst):
    if os.path.abspath(str(dst)) == os.path.join(out, "plan.yaml"):
        os._exit(9)  # killed during the output commit: no cleanup runs
    return real(src, dst)
writer.os.replace = replace
from mpt_cli.main import main
sys.argv = ["mpt", "tune", sys.argv[1], "--out", sys.argv[2], "-q", "--no-latency"]
main()
"""


def test_a_staging_folder_left_by_a_kill_during_the_commit_is_removed_by_the_next_run(runner, tmp_path):
    out = tmp_path / "out"
    killed = subprocess.run([sys.executable, "-c", KILL_DURING_COMMIT, str(MODEL), str(out)],
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == 9, killed.stderr
    staging = [p for p in out.iterdir() if p.name.startswith(STAGING_NAME)]
    assert len(staging) == 1 and (staging[0] / PLAN_NAME).is_file()  # a full plan.yaml, left behind
    assert not (out / PLAN_NAME).exists()
    res = tune(runner, out, "--overwrite")  # the files the kill left are mpt's (claimed before the commit)
    assert res.exit_code == exitcodes.OK, res.output
    assert not [p for p in out.iterdir() if p.name.startswith(STAGING_NAME)]
    assert json.loads((out / MANIFEST_NAME).read_text())["staging"] == []


def test_a_folder_mpt_wrote_is_its_own_until_a_file_in_it_changes(tmp_path):
    """A sharded checkpoint (model.dcp/) is a folder: owned by its tree digest, removed whole."""
    from tuner.core.fingerprint import tree_sha256
    from tuner.workspace.manifest import Manifest

    folder = tmp_path / "model.dcp"
    folder.mkdir()
    (folder / ".metadata").write_text("m")
    manifest = Manifest(tmp_path)
    assert not manifest.owns("model.dcp")  # not recorded: the user's
    manifest.wrote({"model.dcp": tree_sha256(folder)})
    assert Manifest(tmp_path).owns("model.dcp")
    (folder / "extra.distcp").write_text("x")
    assert not Manifest(tmp_path).owns("model.dcp")
    (folder / "extra.distcp").unlink()
    manifest = Manifest(tmp_path)
    manifest.remove("model.dcp")
    assert not folder.exists() and "model.dcp" not in Manifest(tmp_path).files

"""The `.gitignore` a run writes in `out`: what is not meant for git stays out of `git status`."""
import shutil
import subprocess

import pytest

from tuner.core.output_files import (
    COMMITTED,
    GITIGNORE_NAME,
    GITIGNORE_TEXT,
    LOCK_NAME,
    MANIFEST_NAME,
    OUTPUT_FILES,
    STAGING_NAME,
)
from tuner.workspace.folder import OutputFolder
from tuner.workspace.manifest import Manifest

FOR_GIT = {"plan.yaml", "lower_precision_ops.txt", "fp32_ops.txt", "hmp_ops_bf16.txt", "hmp_ops_fp16.txt", "hmp_ops_fp32.txt",
           "report.json"}


def claim(path):
    return OutputFolder.claim(path, resume=True, overwrite=False, outputs=OUTPUT_FILES)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_sees_only_the_files_meant_for_it(tmp_path):
    out = tmp_path / "mpt" / "bf16"
    with claim(out):
        for name in OUTPUT_FILES:
            (out / name).write_text("x")
        (out / f"{STAGING_NAME}-abc").mkdir()
        (out / f"{STAGING_NAME}-abc" / "plan.yaml").write_text("x")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=tmp_path, check=True,
                            capture_output=True, text=True).stdout
    seen = {line[3:].removeprefix("mpt/bf16/") for line in status.splitlines()}
    assert seen == FOR_GIT and FOR_GIT < set(COMMITTED)
    assert {LOCK_NAME, MANIFEST_NAME, GITIGNORE_NAME} <= set(GITIGNORE_TEXT.split())
    assert Manifest(out).owns(GITIGNORE_NAME) and GITIGNORE_NAME in Manifest(out).files  # mpt's own file


def test_a_users_gitignore_is_left_as_it_is(tmp_path):
    (tmp_path / GITIGNORE_NAME).write_text("*.safetensors\n")
    with claim(tmp_path):
        pass
    assert (tmp_path / GITIGNORE_NAME).read_text() == "*.safetensors\n"
    with claim(tmp_path / "b"):  # mpt's own, edited by the user, becomes theirs
        pass
    (tmp_path / "b" / GITIGNORE_NAME).write_text(GITIGNORE_TEXT + "report.json\n")
    with claim(tmp_path / "b"):
        pass
    assert (tmp_path / "b" / GITIGNORE_NAME).read_text().endswith("report.json\n")
    assert not (set(OUTPUT_FILES) & {GITIGNORE_NAME})  # it does not make a folder "hold a run"

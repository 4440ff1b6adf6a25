"""The output folder after a run that failed: nothing left to refuse the rerun until a trial is recorded."""
import pytest

from tuner.core.output_files import GITIGNORE_NAME, JOURNAL_NAME, OUTPUT_FILES
from tuner.workspace.folder import OutputFolder
from tuner.workspace.journal import Journal, RunFingerprint

FINGERPRINT = RunFingerprint(source="s", weights="w")


def _fail_in(path, *, trial: bool, resume: bool = False) -> None:
    with pytest.raises(RuntimeError), OutputFolder.claim(path, resume=resume, overwrite=False, outputs=OUTPUT_FILES):
        journal = Journal(path / JOURNAL_NAME, FINGERPRINT, resume=resume)
        if trial:
            journal.append("baseline#1", {"metric": 1.0, "seconds": 0.1})
        raise RuntimeError("the user's evaluate failed")


def test_a_failure_removes_what_mpt_wrote_for_it_until_a_trial_is_recorded(tmp_path):
    _fail_in(tmp_path / "new", trial=False)
    assert not (tmp_path / "new").exists()  # the claim made it: nothing of it is left
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / GITIGNORE_NAME).write_text("*.ckpt\n")  # the user's: never touched
    _fail_in(tmp_path / "theirs", trial=False)
    assert sorted(p.name for p in (tmp_path / "theirs").iterdir()) == [GITIGNORE_NAME]
    assert (tmp_path / "theirs" / GITIGNORE_NAME).read_text() == "*.ckpt\n"
    _fail_in(tmp_path / "o", trial=True)
    _fail_in(tmp_path / "o", trial=False, resume=True)  # the resumed run fails too: its trial is still there
    assert Journal(tmp_path / "o" / JOURNAL_NAME, FINGERPRINT, resume=True).get("baseline#1") is not None


@pytest.mark.parametrize("resume, overwrite", [(False, False), (True, False), (False, True)])
def test_a_refused_claim_leaves_no_lock_in_the_users_folder(tmp_path, resume, overwrite):
    from tuner.core.errors import ConfigError
    from tuner.core.output_files import CHECKPOINT_NAME

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / CHECKPOINT_NAME).write_bytes(b"the user's weights")
    with pytest.raises(ConfigError, match="mpt did not write"):
        OutputFolder.claim(theirs, resume=resume, overwrite=overwrite, outputs=OUTPUT_FILES)
    assert sorted(p.name for p in theirs.iterdir()) == [CHECKPOINT_NAME]  # no .mpt.lock left behind

"""Every file in a `mpt tune` output folder, named once; every module that reads or writes one uses these names.

The names live in core, not in workspace (the output folder's own package),
because `Plan.load(folder)` (policy) and `tuner.autocast("mpt-out")` (engine)
resolve a folder to its plan file, and neither package may import workspace.
"""
from __future__ import annotations

PLAN_NAME = "plan.yaml"
LOWER_OPS_NAME = "lower_precision_ops.txt"  # Gaudi autocast's PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST file
FP32_OPS_NAME = "fp32_ops.txt"  # Gaudi autocast's PT_HPU_AUTOCAST_FP32_OPS_LIST file
HMP_BF16_NAME = "hmp_ops_bf16.txt"  # HMP's bf16_file_path file (hmp.convert, tuner.convert)
HMP_FP16_NAME = "hmp_ops_fp16.txt"  # an fp16 plan's lower list in HMP's format (tuner.convert: HMP runs bf16 only)
HMP_FP32_NAME = "hmp_ops_fp32.txt"  # HMP's fp32_file_path file
CHECKPOINT_NAME = "model.safetensors"
SHARDED_CHECKPOINT_NAME = "model.dcp"  # a sharded model's checkpoint: a torch.distributed.checkpoint folder
REPORT_JSON_NAME = "report.json"
SEARCH_PAGE_NAME = "search.html"
REPORT_MD_NAME = "report.md"
JOURNAL_NAME = "journal.jsonl"  # kept across runs for --resume (tuner.workspace.journal)
INPUTS_NAME = "journal-inputs.safetensors"  # inputs recorded from the first forward call, beside the journal
REFERENCE_NAME = "fidelity-reference.safetensors"  # a built-in metric's FP32 outputs (tuner.workspace.reference)
LOCK_NAME = ".mpt.lock"  # held while a run uses the folder (tuner.workspace.folder)
STAGING_NAME = ".mpt-staging"  # the writer's staging folder (STAGING_NAME-<random>), gone once committed
MANIFEST_NAME = ".mpt-manifest.json"  # what mpt wrote into the folder, with digests (tuner.workspace.manifest)
GITIGNORE_NAME = ".gitignore"  # written when a run claims the folder, unless one mpt did not write is there

# The outputs a tune writes as a set, in the order they are committed: plan.yaml, the file that claims success, last.
COMMITTED = (LOWER_OPS_NAME, FP32_OPS_NAME, HMP_BF16_NAME, HMP_FP16_NAME, HMP_FP32_NAME, CHECKPOINT_NAME,
             SHARDED_CHECKPOINT_NAME, REPORT_JSON_NAME, SEARCH_PAGE_NAME, REPORT_MD_NAME, PLAN_NAME)
# Everything a run leaves that makes the folder "hold a run" (refused without resume/overwrite; overwrite removes it).
OUTPUT_FILES = COMMITTED + (JOURNAL_NAME, INPUTS_NAME, REFERENCE_NAME)

# What the folder's .gitignore keeps out of git: the run's working files (lock, manifest, staging, journal and its
# inputs), the converted weights (large and binary; a re-tune writes them again) and the renderings whose timings
# change on every run (report.md, search.html: a CI job posts or uploads them). Left for git: plan.yaml, the op lists
# and report.json. It ignores itself too (as pytest's cache folder does); a user's edit makes it theirs: mpt keeps it.
NOT_FOR_GIT = (GITIGNORE_NAME, LOCK_NAME, MANIFEST_NAME, STAGING_NAME + "-*", JOURNAL_NAME, INPUTS_NAME, REFERENCE_NAME,
               CHECKPOINT_NAME, SHARDED_CHECKPOINT_NAME, REPORT_MD_NAME, SEARCH_PAGE_NAME)
GITIGNORE_TEXT = ("# written by mpt tune: the files of this folder not meant for git; commit plan.yaml, the op lists\n"
                  "# and report.json (mpt never replaces a .gitignore it did not write)\n" +
                  "".join(f"{name}\n" for name in NOT_FOR_GIT))


def hmp_lower_name(dtype: str) -> str:
    """The HMP-format lower list's file name for a plan in `dtype` ("bf16", "fp16"): named for what it lowers to."""
    return HMP_FP16_NAME if dtype == "fp16" else HMP_BF16_NAME

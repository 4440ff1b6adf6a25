"""Sharded models under torchrun: FSDP2 and tensor parallel on a CPU mesh of 2 gloo ranks
(tests/assets/sharded_model.py shards the planted chain of dist_model.py as MPT_TEST_SHARD says).

Each torchrun start costs seconds, so the runs are few and shared: one FSDP2 tune (with latency timing and
--consolidate), one tensor-parallel tune (DCP only), one process tuning the unsharded model, and one torchrun
that loads both sharded checkpoints back into sharded models.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from mpt_cli import exitcodes
from mpt_cli.main import main
from tests.search.test_distributed import BOUND, ROOT, base_env, finish, free_port, start_ranks

ASSETS = Path(__file__).parents[1] / "assets"
MODEL = str(ASSETS / "sharded_model.py")
PLANTED = [{"module": f"branches.{j}", "op": "linear", "index": 0} for j in range(2)]

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available"),
              pytest.mark.skipif(sys.platform == "win32", reason="gloo over TCP")]


def plan(out: Path) -> dict:
    return yaml.safe_load((out / "plan.yaml").read_text())


def report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def sharded(out: Path, shard: str, *args: str, latency: bool = False, **env: str) -> tuple[int, str, str]:
    """`mpt tune` of the model sharded as `shard` says on 2 ranks (started as torchrun would, without its
    launcher: seconds saved): rank 0's (exit code, stdout, stderr), once rank 1 exited 0 too."""
    (rc0, out0, err0), (rc1, _, err1) = finish(start_ranks(out, *args, *(("--latency",) if latency else ()),
                                                           models=(MODEL, MODEL), MPT_TEST_SHARD=shard, **env),
                                               timeout=120)
    assert rc1 == rc0, (rc0, rc1, err1[-3000:])
    return rc0, out0, err0


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(tmp, results): the FSDP2, tensor-parallel and one-process tunes of the same model."""
    from click.testing import CliRunner

    tmp = tmp_path_factory.mktemp("sharded")
    results = {"fsdp": sharded(tmp / "fsdp", "fsdp", "--consolidate", latency=True, MPT_TEST_EXIT=str(tmp / "exit")),
               "tp": sharded(tmp / "tp", "tp")}
    one = CliRunner().invoke(main, ["tune", MODEL, "--out", str(tmp / "one"), "--no-latency"])
    assert one.exit_code == 0, one.output
    return tmp, results


def test_sharded_tunes_find_the_unsharded_plan_and_checkpoints_reproduce_the_metric(runs):
    tmp, results = runs
    for shard, (rc, stdout, stderr) in results.items():
        assert rc == 0, (shard, stdout[-2000:], stderr[-3000:])
        assert stdout.count("target met") == 1 and "mpt: error" not in stderr, stdout
        assert "8 op instances run in bf16" in stdout  # no collective is a candidate
    one = tmp / "one"
    assert plan(one)["fp32_instances"] == PLANTED
    for shard in results:
        out = tmp / shard
        assert plan(out)["fp32_instances"] == PLANTED
        # the same model as far as a plan can tell: unwrapped classes (no FSDPLinear), global shapes
        assert plan(out)["model"]["structure"] == plan(one)["model"]["structure"]
        # lowered by name as in one process, though FSDP2's forward uses gathered copies
        assert report(out)["checkpoint"]["lowered"] == report(one)["checkpoint"]["lowered"] > 0
        files = sorted(p.name for p in (out / "model.dcp").iterdir())
        assert ".metadata" in files and len([f for f in files if f.endswith(".distcp")]) == 2, files
    assert (tmp / "fsdp" / "model.safetensors").is_file() and not (tmp / "tp" / "model.safetensors").exists()
    latency = report(tmp / "fsdp")["latency_ms"]
    assert latency is not None and latency["fp32"] > 0 and latency["tuned"] > 0  # timed on both ranks together
    assert report(tmp / "tp")["latency_ms"] is None
    # The ranks ended without the interpreter's teardown, where the gloo group FSDP2 keeps alive can abort a
    # rank after a tune that succeeded; the exit handlers the user's code registered still ran.
    for rank in range(2):
        assert Path(f"{tmp / 'exit'}.atexit.{rank}").is_file(), rank
        assert not Path(f"{tmp / 'exit'}.final.{rank}").exists(), rank

    # Unsharded, in this process: the consolidated file (FSDP2 run), the DCP folder read whole (TP run).
    import tuner
    from tests.assets import sharded_model

    for shard in results:
        model = tuner.load(sharded_model.build_model(), tmp / shard)
        assert sharded_model.evaluate(model) == report(tmp / shard)["final_metric"]
    consolidated = tuner.load(sharded_model.build_model(), tmp / "fsdp")
    assert consolidated.chain[0].weight.dtype == torch.bfloat16 and consolidated.branches[0].weight.dtype == \
        torch.float32  # stored lowered per the plan: the fragile branches stay FP32

    # Sharded, on 2 ranks: each folder into the model sharded as it was tuned.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           str(ASSETS / "load_sharded.py"), str(tmp / "loaded"), f"fsdp:{tmp / 'fsdp'}", f"tp:{tmp / 'tp'}",
           f"fsdp:{tmp / 'one'}", f"tp:{tmp / 'one'}"]  # and the unsharded run's plan on sharded models
    res = subprocess.run(cmd, cwd=ROOT, env=base_env(), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [json.loads(line) for rank in range(2)
             for line in Path(f"{tmp / 'loaded'}.{rank}").read_text().splitlines()]
    assert len(lines) == 8
    for line in lines:
        assert line["metric"] == report(Path(line["folder"]))["final_metric"]
        assert line["dtypes"] == ["torch.float32"]  # the lowered values widened into the FP32 shards
        assert line["rounded"] == ["chain.0.weight"]  # loaded: lowered per the plan, the fragile branch FP32


def test_a_sharded_run_resumes_from_its_journal(runs, tmp_path):
    tmp, results = runs
    assert results["tp"][0] == 0
    out = tmp_path / "tp"
    shutil.copytree(tmp / "tp", out)
    rc, stdout, stderr = sharded(out, "tp", "--resume")
    assert rc == 0, stderr[-3000:]
    evaluations = report(tmp / "tp")["evaluations"]
    assert stdout.count("[journal]") == evaluations and plan(out)["fp32_instances"] == PLANTED
    assert (out / "model.dcp" / ".metadata").is_file()  # rewritten over the folder mpt wrote before


@pytest.mark.parametrize("how", ["raise", "kill"])
def test_a_rank_that_raises_or_dies_ends_every_rank(tmp_path, how):
    env = {"MPT_TEST_SHARD": "fsdp", f"MPT_TEST_{how.upper()}": "1:3"}
    t0 = time.monotonic()
    (rc0, _, err0), (rc1, _, err1) = finish(start_ranks(tmp_path / "out", models=(MODEL, MODEL), **env))
    assert time.monotonic() - t0 < BOUND
    assert err0.count("mpt: error:") == 1 and "Traceback" not in err0, err0
    if how == "raise":
        assert (rc0, rc1) == (exitcodes.USER_CODE, exitcodes.USER_CODE), (err0, err1)
        assert "rank 1: evaluate raised ValueError: planted failure on rank 1" in err0 and "mpt: error" not in err1
    else:
        assert rc1 == -9 and rc0 == exitcodes.USER_CODE, (rc0, rc1, err0)


def test_a_2d_mesh_is_refused_with_exit_2_in_one_line(tmp_path):
    (rc0, _, err0), (rc1, _, err1) = finish(start_ranks(tmp_path / "out", models=(MODEL, MODEL),
                                                        MPT_TEST_SHARD="hsdp"))
    assert (rc0, rc1) == (exitcodes.USAGE, exitcodes.USAGE), (err0, err1)
    errors = [line for line in err0.splitlines() if line.startswith("mpt: error:")]
    assert len(errors) == 1 and "2-D device mesh (1, 2)" in errors[0] and "1-D mesh of every rank" in errors[0]
    assert "mpt: error" not in err1 and not (tmp_path / "out" / "plan.yaml").exists()


def test_communication_ops_are_recognised_under_their_dispatch_names():
    from tuner.policy.opnames import is_communication, is_neutral

    for name in ("all_reduce", "_wrap_tensor_autograd.default", "_c10d_functional.all_gather_into_tensor",
                 "wait_tensor", "redistribute", "all_gather_copy_in"):
        assert is_communication(name) and is_neutral(name), name
    for name in ("linear", "matmul", "add", "all"):
        assert not is_communication(name), name

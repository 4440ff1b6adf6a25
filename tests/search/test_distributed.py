"""`mpt tune` under torchrun: 2 CPU processes on gloo (tests/assets/dist_model.py shards its data and
all-reduces the count of correct predictions).

The ranks take rank 0's decisions, so they give the plan one process gives, and only rank 0 prints and
writes. A rank that fails stops every rank, with its exit code, in bounded time. Some tests start the
two ranks themselves (with the variables torchrun sets) to see each rank's exit code; the others go
through `python -m torch.distributed.run`, whose own exit code is 1 when any worker failed.
"""
from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from mpt_cli import exitcodes
from mpt_cli.main import main

ROOT = Path(__file__).resolve().parents[2]
MODEL = str(Path(__file__).parents[1] / "assets" / "dist_model.py")
BOUND = 60.0  # seconds: a failed run must have ended every rank by then

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available"),
              pytest.mark.skipif(sys.platform == "win32", reason="gloo over TCP and POSIX signals")]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "MPT_DIST_TIMEOUT": "30", **extra}


def torchrun(out: Path, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(free_port()), "-m", "mpt_cli", "tune", MODEL, "--out", str(out), "--no-latency", *args]
    return subprocess.run(cmd, cwd=ROOT, env=base_env(**env), capture_output=True, text=True, timeout=timeout)


def start_ranks(out: Path, *args: str, models: tuple[str, str] = (MODEL, MODEL), **env: str) -> list[subprocess.Popen]:
    """The two ranks as torchrun would start them, without torchrun: each one's exit code is ours to see.
    `models`: each rank's model file."""
    port = str(free_port())
    procs = []
    for rank in range(2):
        rank_env = base_env(**env, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                            MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen([sys.executable, "-m", "mpt_cli", "tune", models[rank], "--out", str(out),
                                       "--no-latency", *args], cwd=ROOT, env=rank_env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    return procs


def finish(procs: list[subprocess.Popen], timeout: float = BOUND) -> list[tuple[int, str, str]]:
    try:
        outputs = [p.communicate(timeout=timeout) for p in procs]
        return [(p.returncode, *o) for p, o in zip(procs, outputs)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()


def plan_instances(out: Path) -> list[dict]:
    return yaml.safe_load((out / "plan.yaml").read_text())["fp32_instances"]


def journal_keys(out: Path) -> list[str]:
    return [r["key"] for r in map(json.loads, (out / "journal.jsonl").read_text().splitlines())
            if r.get("kind") == "eval"]


def calls(counter: Path, rank: int) -> int:
    path = Path(f"{counter}.{rank}")
    return len(path.read_text().splitlines()) if path.is_file() else 0


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory):
    """One complete 2-rank tune, shared by the tests that only read it."""
    tmp = tmp_path_factory.mktemp("dist")
    out, counter = tmp / "out", tmp / "calls"
    res = torchrun(out, "--thorough", MPT_TEST_COUNT=str(counter))
    return tmp, out, counter, res


def test_two_ranks_give_the_one_process_plan_and_write_it_once(two_rank_run, runner, tmp_path):
    tmp, out, counter, res = two_rank_run
    assert res.returncode == 0, (res.stdout, res.stderr)
    single = tmp_path / "single"
    one = runner.invoke(main, ["tune", MODEL, "--out", str(single), "--no-latency", "--thorough"])
    assert one.exit_code == 0, one.output
    planted = [{"module": f"branches.{j}", "op": "linear", "index": 0} for j in range(2)]
    assert plan_instances(out) == plan_instances(single) == planted

    # Rank 0 alone prints and writes: one report, one journal line per evaluation, no second folder.
    assert res.stdout.count("target met") == 1 and res.stdout.count("baseline 1.000;") == 1, res.stdout
    assert "mpt: error" not in res.stderr
    keys = journal_keys(out)
    assert len(keys) == len(set(keys)) == json.loads((out / "report.json").read_text())["evaluations"]
    assert journal_keys(single) == keys  # the same evaluations, in the same order
    assert sorted(p.name for p in tmp.iterdir()) == ["calls.0", "calls.1", "out"]
    # Every rank ran every evaluation (its shard of the data).
    assert calls(counter, 0) == calls(counter, 1) == len(keys)


def test_resume_with_a_complete_journal_evaluates_nothing(two_rank_run, tmp_path):
    _, done, _, res = two_rank_run
    assert res.returncode == 0
    out, counter = tmp_path / "out", tmp_path / "calls"
    shutil.copytree(done, out)
    again = torchrun(out, "--resume", "--thorough", MPT_TEST_COUNT=str(counter))
    assert again.returncode == 0, (again.stdout, again.stderr)
    assert calls(counter, 0) == calls(counter, 1) == 0
    trials = len(journal_keys(done))  # the baseline's run is trial 1
    assert again.stdout.count("[journal]") == trials > 4 and plan_instances(out) == plan_instances(done)


def test_a_rank_that_raises_stops_every_rank_with_exit_4(tmp_path):
    out = tmp_path / "out"
    t0 = time.monotonic()
    (rc0, out0, err0), (rc1, out1, err1) = finish(start_ranks(out, MPT_TEST_RAISE="1:3"))
    assert time.monotonic() - t0 < BOUND
    assert (rc0, rc1) == (exitcodes.USER_CODE, exitcodes.USER_CODE), (err0, err1)
    # One clear error, from rank 0, naming the rank that failed; the other rank says nothing.
    assert err0.count("mpt: error:") == 1 and "rank 1: evaluate raised ValueError: planted failure on rank 1" \
        in err0 and "all ranks stopped" in err0, err0
    assert "mpt: error" not in err1 and not out1, (out1, err1)
    assert "Traceback" not in err0 + err1
    assert journal_keys(out) == ["baseline#1", "fp32="]  # kept for --resume (the all-low trial settled the baseline)


def test_failure_under_torchrun_then_resume_repeats_no_evaluation(tmp_path):
    out, counter = tmp_path / "out", tmp_path / "calls"
    t0 = time.monotonic()
    res = torchrun(out, MPT_TEST_RAISE="0:3", timeout=BOUND)
    assert time.monotonic() - t0 < BOUND
    assert res.returncode != 0
    errors = [line for line in res.stderr.splitlines() if line.startswith("mpt: error:")]
    assert len(errors) == 1 and re.fullmatch(r"mpt: error: rank 0: evaluate raised ValueError: planted failure on "
                                             r"rank 0 \(dist_model\.py:\d+\) \(all ranks stopped\)", errors[0]), res.stderr
    finished = journal_keys(out)
    assert finished == ["baseline#1", "fp32="]

    again = torchrun(out, "--resume", MPT_TEST_COUNT=str(counter))
    assert again.returncode == 0, (again.stdout, again.stderr)
    keys = journal_keys(out)
    assert keys[:2] == finished and len(keys) == len(set(keys))
    assert calls(counter, 0) == calls(counter, 1) == len(keys) - len(finished)


def test_a_signal_on_one_rank_stops_every_rank_with_exit_130(tmp_path):
    out = tmp_path / "out"
    procs = start_ranks(out, MPT_TEST_SLEEP="0.3")
    deadline = time.monotonic() + BOUND
    while not ((out / "journal.jsonl").is_file() and journal_keys(out)) and time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), finish(procs)
        time.sleep(0.05)
    procs[1].send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    (rc0, _, err0), (rc1, _, err1) = finish(procs)
    assert time.monotonic() - t0 < BOUND
    assert (rc0, rc1) == (exitcodes.INTERRUPTED, exitcodes.INTERRUPTED), (err0, err1)
    assert err0.count("mpt: error:") == 1 and "rank 1: interrupted" in err0 and "--resume" in err0, err0
    assert "mpt: error" not in err1


def test_a_rank_that_hangs_ends_the_run_at_the_timeout(tmp_path):
    t0 = time.monotonic()
    (rc0, _, err0), (rc1, _, err1) = finish(start_ranks(tmp_path / "out", MPT_TEST_HANG="1:3", MPT_DIST_TIMEOUT="3"))
    assert time.monotonic() - t0 < BOUND
    assert (rc0, rc1) == (exitcodes.USER_CODE, exitcodes.USER_CODE), (err0, err1)
    assert err0.count("mpt: error:") == 1 and "rank 0: evaluate raised" in err0 \
        and re.search("timed? ?out", err0, re.IGNORECASE), err0


def test_a_metric_that_is_not_all_reduced_stops_every_rank(tmp_path):
    (rc0, _, err0), (rc1, _, err1) = finish(start_ranks(tmp_path / "out", MPT_TEST_NO_REDUCE="1"))
    assert (rc0, rc1) == (exitcodes.USER_CODE, exitcodes.USER_CODE), (err0, err1)
    assert err0.count("mpt: error:") == 1 and "different metrics on the 2 ranks (rank 0: " in err0 \
        and "must all-reduce its metric" in err0, err0
    assert "mpt: error" not in err1


def test_ranks_that_build_different_weights_stop_with_exit_4_naming_the_ranks(tmp_path):
    out, counter = tmp_path / "out", tmp_path / "calls"
    (rc0, out0, err0), (rc1, _, err1) = finish(start_ranks(out, MPT_TEST_RANK_WEIGHTS="1",
                                                           MPT_TEST_COUNT=str(counter)))
    assert (rc0, rc1) == (exitcodes.USER_CODE, exitcodes.USER_CODE), (err0, err1)
    assert err0.count("mpt: error:") == 1 and re.search(r"rank 1 built different FP32 weights from rank 0 "
                                                        r"\(rank 0: [0-9a-f]{12}, rank 1: [0-9a-f]{12}\)", err0), err0
    assert "mpt: error" not in err1 and "Traceback" not in err0 + err1
    assert calls(counter, 0) == calls(counter, 1) == 0  # refused before any evaluation: no mixed baseline
    assert not (out / "plan.yaml").exists()


def test_ranks_that_run_different_model_files_stop_with_exit_4_naming_the_ranks(tmp_path):
    models = []
    for rank in range(2):
        folder = tmp_path / f"rank{rank}"
        folder.mkdir()
        text = Path(MODEL).read_text() + ("\n# edited on rank 1 only\n" if rank else "")
        (folder / "dist_model.py").write_text(text)
        models.append(str(folder / "dist_model.py"))
    (rc0, _, err0), (rc1, _, err1) = finish(start_ranks(tmp_path / "out", models=tuple(models)))
    assert (rc0, rc1) == (exitcodes.USER_CODE, exitcodes.USER_CODE), (err0, err1)
    assert err0.count("mpt: error:") == 1 and "rank 1 built different model files from rank 0" in err0 \
        and "every rank must run the same model file and the files it imports" in err0, err0


# --- the library's pieces, in one process ------------------------------------------------------------------
def test_one_process_ranks_do_nothing():
    from tuner.search.distributed import Ranks

    ranks = Ranks()
    assert not ranks.distributed and ranks.is_main
    assert ranks.broadcast({"a": 1}) == {"a": 1} and ranks.gather(2.0) == [2.0] and ranks.agree(0.5) == 0.5
    assert ranks.decide(lambda: 3) == 3 and ranks.finish(None) == 0 and ranks.finish(3) == 3


def run_alone(out: Path, **env: str) -> subprocess.CompletedProcess:
    """`mpt tune` started by hand in a shell holding these torchrun variables (and no others)."""
    clean = {k: v for k, v in base_env(**env).items() if k not in ("MASTER_ADDR", "MASTER_PORT") or k in env}
    return subprocess.run([sys.executable, "-m", "mpt_cli", "tune", MODEL, "--out", str(out), "--no-latency"],
                          cwd=ROOT, env={**clean, "MPT_DIST_TIMEOUT": "1800"}, capture_output=True, text=True,
                          timeout=BOUND)


@pytest.mark.parametrize("env", [{"WORLD_SIZE": "2"}, {"WORLD_SIZE": "2", "RANK": "0"},
                                 {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "127.0.0.1"}],
                         ids=["world-size-only", "rank-0-no-master", "no-master-port"])
def test_torchrun_variables_without_torchrun_are_one_usage_error(tmp_path, env):
    """WORLD_SIZE left in a shell: exit 2 at once with one mpt line, not exit 4 "could not join within 1800 s"."""
    res = run_alone(tmp_path / "out", **env)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mpt: error: WORLD_SIZE=2 is set but "), res.stderr
    assert "is not a torchrun worker" in lines[0] and "torchrun --nproc-per-node 2" in lines[0]
    assert not (tmp_path / "out").exists()


def test_a_lone_rank_1_says_so_in_one_line(tmp_path):
    """Rank 1 with no rank 0: one mpt line on rank 1 itself (no group exists for rank 0 to report through),
    exit 2, and none of torch's C++ stack frames."""
    res = run_alone(tmp_path / "out", WORLD_SIZE="2", RANK="1", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(free_port()))
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mpt: error: rank 1 of 2: nothing answers at "), res.stderr
    assert "rank 0 is not running" in lines[0] and "frame #" not in res.stderr


def test_from_env_without_torchrun_is_one_process(monkeypatch):
    from tuner.search.distributed import Ranks
    from tuner.core.errors import ConfigError

    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert not Ranks.from_env().distributed
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not Ranks.from_env().distributed
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ConfigError, match="RANK='2' with WORLD_SIZE=2"):
        Ranks.from_env()
    monkeypatch.setenv("MPT_DIST_TIMEOUT", "soon")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError, match="MPT_DIST_TIMEOUT"):
        Ranks.from_env()


class _PickledRanks:
    """Rank 0 of two, where a broadcast is a pickle round trip (what broadcast_object_list does)."""

    def __new__(cls):
        from tuner.search.distributed import Ranks

        class Fake(Ranks):
            def broadcast(self, obj):
                return pickle.loads(pickle.dumps(obj))

            def gather(self, obj):
                return [obj, self.other]

        fake = Fake(0, 2)
        fake.other = None
        return fake


def test_decide_raises_rank_0s_exception_on_every_rank():
    from tuner.search.strategy import SearchStopped
    from tuner.search.results import StopReason

    def bound() -> None:
        raise SearchStopped(StopReason.MAX_EVALS)

    with pytest.raises(SearchStopped) as info:
        _PickledRanks().decide(bound)
    assert info.value.reason is StopReason.MAX_EVALS  # not its str(): the session reads .reason.value


def test_agree_names_each_ranks_metric():
    from tuner.core.errors import UserCodeError

    ranks = _PickledRanks()
    ranks.other = 0.5 * (1 + 1e-9)
    assert ranks.agree(0.5) == 0.5  # all-reduced values may differ in the last bits
    ranks.other = float("nan")
    with pytest.raises(UserCodeError, match=r"rank 0: 0.5, rank 1: nan"):
        ranks.agree(0.5)
    assert ranks.agree(float("nan")) != ranks.agree(float("nan"))  # nan on every rank: agreed, and nan


def test_shared_journal_needs_the_journal_on_rank_0_only(tmp_path):
    from tuner.search.distributed import SharedJournal
    from tuner.workspace.journal import Journal, RunFingerprint

    ranks = _PickledRanks()
    with pytest.raises(ValueError, match="rank 0"):
        SharedJournal(None, ranks)
    journal = Journal(tmp_path / "journal.jsonl", RunFingerprint("s", "w"), resume=False)
    shared = SharedJournal(journal, ranks)
    shared.append("k", {"metric": 1.0, "seconds": 0.1})
    assert shared.get("k")["metric"] == 1.0 and shared.get("missing") is None


def test_a_lone_rank_0_ends_within_the_join_timeout(tmp_path):
    """Rank 0 started by hand with WORLD_SIZE=2 and nobody else: exit 2 with one mpt line after
    MPT_DIST_JOIN_TIMEOUT, not after MPT_DIST_TIMEOUT (the collectives' timeout, 1800 s here)."""
    start = time.monotonic()
    env = base_env(WORLD_SIZE="2", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    res = subprocess.run([sys.executable, "-m", "mpt_cli", "tune", MODEL, "--out", str(tmp_path / "out"),
                          "--no-latency"], cwd=ROOT, env={**env, "MPT_DIST_TIMEOUT": "1800",
                                                          "MPT_DIST_JOIN_TIMEOUT": "3"},
                         capture_output=True, text=True, timeout=BOUND)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mpt: error: rank 0 of 2: the other ranks did not join within 3 s")
    assert "torchrun --nproc-per-node 2" in lines[0] and "frame #" not in res.stderr
    assert time.monotonic() - start < 60
    assert not (tmp_path / "out").exists()

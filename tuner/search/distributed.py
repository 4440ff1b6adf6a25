"""Tuning under torchrun: every rank runs the same TuneSession; rank 0 decides and the others follow.

`Ranks.from_env()` reads what torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT). With no WORLD_SIZE, or WORLD_SIZE=1, it is a
single-process context whose methods do nothing. Otherwise it joins (or
creates) the default process group: gloo on CPU, `cpu:gloo,cuda:nccl` on
CUDA with `torch.cuda.set_device(LOCAL_RANK)`, so the user's `evaluate` can
use `torch.distributed` directly. mpt's own messages travel over a gloo
group, all with a bounded timeout (MPT_DIST_TIMEOUT seconds, default 1800).

How the ranks stay in step (SPMD): every rank builds the model, runs every
forward pass and every `evaluate`; whatever steers the search is rank 0's,
broadcast (`broadcast`): the journal's answers (`SharedJournal`: only rank
0 reads and writes the file), the ranking scores, each set of op instances
to test, whether a bound (evaluations, time) stops the search (`decide`).
The metric that counts is the one `evaluate` returns, which must be the
same on every rank (all-reduce it): `agree` checks that and raises
UserCodeError naming each rank's value when it is not.

How a failure stops every rank, never a hang (`watch`, `abort`): each rank
runs a watchdog thread that polls one key of the process group's store every
0.2 s. A rank that fails (an error, an interrupt) posts its exit code and a
one-line message there and waits (a few seconds at most) until the others
acknowledged it; the others' watchdogs end their process with the same code.
Rank 0 reports the first failure posted, once. A rank that dies without a
word (killed, out of memory) ends the others' collectives with an error, or
their wait at the timeout.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import torch

from tuner.core.errors import ConfigError, UserCodeError, exc_line
from tuner.core.launch_env import end_process, env_int, env_world_size, launch_problem

if TYPE_CHECKING:
    from tuner.core.inputs import ModelInputs
    from tuner.workspace.journal import Journal

T = TypeVar("T")
K = TypeVar("K")

TIMEOUT_ENV = "MPT_DIST_TIMEOUT"
DEFAULT_TIMEOUT = 1800.0  # seconds a rank waits for the others in one collective
POLL_SECONDS = 0.2  # how often the watchdog looks for a failure posted by another rank
ACK_SECONDS = 5.0  # how long a failing rank waits for the others to see its failure
METRIC_RTOL = 1e-6  # ranks agree on a metric when their values are this close (relative)
_LOST_POLLS = 5  # store errors in a row before a watchdog gives rank 0 up for lost
JOIN_PROBE_SECONDS = 10.0  # how long a rank > 0 waits for anything to listen at MASTER_ADDR:MASTER_PORT
JOIN_TIMEOUT_ENV = "MPT_DIST_JOIN_TIMEOUT"
DEFAULT_JOIN_TIMEOUT = 60.0  # seconds every rank has to start and join, before any collective

_ABORT_KEY, _COUNT_KEY, _ACKS_KEY = "abort", "abort_count", "abort_acks"


class RankLost(UserCodeError):
    """Another rank stopped answering: it was killed, ran out of memory, or hung past the timeout."""


@dataclass(frozen=True)
class Abort:
    """A failure one rank posted for all: the exit code every rank ends with and what rank 0 reports."""

    code: int
    rank: int
    message: str
    notes: tuple[str, ...] = ()
    lost: bool = False  # posted by nobody: this rank lost contact with rank 0

    def to_json(self) -> str:
        return json.dumps({"code": self.code, "rank": self.rank, "message": self.message, "notes": list(self.notes)})

    @classmethod
    def from_json(cls, text: bytes | str) -> Abort:
        data = json.loads(text)
        return cls(int(data["code"]), int(data["rank"]), str(data["message"]), tuple(data.get("notes") or ()))


Report = Callable[[Abort], None]


def env_timeout() -> float:
    """Seconds a collective may wait: MPT_DIST_TIMEOUT, default 1800."""
    return _env_seconds(TIMEOUT_ENV, DEFAULT_TIMEOUT)


def env_join_timeout() -> float:
    """Seconds the ranks have to find each other: MPT_DIST_JOIN_TIMEOUT, default 60."""
    return _env_seconds(JOIN_TIMEOUT_ENV, DEFAULT_JOIN_TIMEOUT)


def _env_seconds(name: str, default: float) -> float:
    """A positive number of seconds from environment variable `name` (`default` when unset); ConfigError else."""
    value = os.environ.get(name, "").strip()
    try:
        seconds = float(value) if value else default
    except ValueError:
        seconds = -1.0
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"{name}={value!r}: expected seconds > 0")
    return seconds


class Ranks:
    """The ranks of one tune: `rank` of `size`. `Ranks()` is one process, where every method is a no-op."""

    def __init__(self, rank: int = 0, size: int = 1, local_rank: int = 0, *, group: Any = None, store: Any = None,
                 timeout: float = DEFAULT_TIMEOUT, owns: tuple[Any, ...] = ()) -> None:
        self.rank, self.size, self.local_rank = rank, size, local_rank
        self.group = group  # the gloo group mpt's own messages travel on (None: the default group)
        self.store = store  # the process group's store, under a prefix of mpt's own
        self.timeout = timeout
        self._owns = owns  # groups this object created and destroys in finish(); "default" for the default one
        self._stop = threading.Event()
        self._exiting = threading.Lock()  # taken by whichever thread ends the process on a failure
        self._watchdog: threading.Thread | None = None
        self._report: Report | None = None  # set by watch(): how rank 0 reports another rank's failure

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # --- setup -----------------------------------------------------------------------------------------------
    @classmethod
    def from_env(cls, device: str = "cpu", *, timeout: float | None = None) -> Ranks:
        """The ranks torchrun started, with the default process group initialized; one process without it."""
        size = env_world_size()
        if size <= 1:
            return cls()
        import torch.distributed as dist

        if not dist.is_available():
            raise ConfigError(f"WORLD_SIZE={size} says this is a torchrun worker, but this torch build has no "
                              "torch.distributed")
        rank, local_rank = env_int("RANK", -1), env_int("LOCAL_RANK", 0)
        if rank != -1 and not 0 <= rank < size:
            raise ConfigError(f"RANK={os.environ.get('RANK')!r} with WORLD_SIZE={size}: expected 0 to {size - 1} "
                              "(start mpt with torchrun, which sets them)")
        seconds = env_timeout() if timeout is None else timeout
        problem = launch_problem(size, group_ready=dist.is_initialized())
        if problem:
            raise ConfigError(problem)
        if rank > 0 and not dist.is_initialized():
            _probe_master(rank, size, min(seconds, JOIN_PROBE_SECONDS))
        if device == "cuda" and torch.cuda.is_available():  # without CUDA, check_device says so
            torch.cuda.set_device(local_rank)
        group, owns = _join(rank, size, device, seconds)
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")  # a restarted run starts with a clean slate
        store = dist.PrefixStore(f"mpt/{attempt}/", _store(_dt.timedelta(seconds=seconds),
                                                          own_client="default" in owns))
        return cls(rank, size, local_rank, group=group, store=store, timeout=seconds, owns=owns)

    # --- messages between ranks ------------------------------------------------------------------------------
    def broadcast(self, obj: T) -> T:
        """Rank 0's `obj` on every rank (any picklable object)."""
        if not self.distributed:
            return obj
        import torch.distributed as dist

        box = [obj]
        self._collective(dist.broadcast_object_list, box, src=0, group=self.group)
        return box[0]

    def gather(self, obj: T) -> list[T]:
        """Every rank's `obj`, in rank order, on every rank."""
        if not self.distributed:
            return [obj]
        import torch.distributed as dist

        found: list[Any] = [None] * self.size
        self._collective(dist.all_gather_object, found, obj, group=self.group)
        return found

    def mean(self, scores: dict[K, float]) -> dict[K, float]:
        """Each key's mean over the ranks' `scores` (the same keys on every rank): the same dict on every rank,
        so every rank ranks alike (a sharded model's ranks score through their own shards)."""
        if not self.distributed:
            return scores
        found = self.gather(scores)
        return {key: math.fsum(s[key] for s in found) / len(found) for key in found[0]}

    def decide(self, check: Callable[[], T]) -> T:
        """Rank 0 runs `check`; every rank returns what it returned or raises the Exception it raised."""
        if not self.distributed:
            return check()
        outcome: tuple[bool, Any] | None = None
        if self.is_main:
            try:
                outcome = (True, check())
            except Exception as exc:  # noqa: BLE001 - re-raised on every rank below
                outcome = (False, (type(exc), exc.args, dict(vars(exc))))
        done, value = self.broadcast(outcome)  # type: ignore[misc]
        if done:
            return value
        cls, args, state = value
        error = cls.__new__(cls)  # not cls(*args): an exception's args need not be its constructor's
        error.args = args
        error.__dict__.update(state)
        raise error

    def agree(self, metric: float, what: str = "evaluate") -> float:
        """The metric every rank got, which must be the same: rank 0's value, the all-reduced one."""
        values = self.gather(metric)
        first = values[0]
        if all(_same(v, first) for v in values):
            return first
        shown = ", ".join(f"rank {r}: {v:.9g}" for r, v in enumerate(values))
        raise UserCodeError(f"{what} returned different metrics on the {self.size} ranks ({shown}); under "
                            "torchrun, evaluate must all-reduce its metric (torch.distributed.all_reduce of the "
                            "counts or sums) so every rank returns the same value")

    def same(self, value: Any, what: str) -> None:
        """Raise UserCodeError unless every rank has the same `value` (`what` says what it is)."""
        values = self.gather(value)
        differ = [r for r, v in enumerate(values) if v != values[0]]
        if differ:
            raise UserCodeError(f"the ranks found different {what} (rank 0 and rank {differ[0]} differ): every "
                                "rank must build the same model and give it the same example inputs")

    def same_model(self, source: str, weights: str) -> None:
        """UserCodeError unless every rank runs the same user files (`source`, their digest) and built the
        same FP32 weights (`weights`, their digest) as rank 0, naming the ranks that differ and each digest.

        The journal and plan record rank 0's; a rank whose model differs would score other numbers under
        the same name (a mixed "FP32 baseline")."""
        found = self.gather((source, weights))
        for part, what, hint in ((0, "model files", "every rank must run the same model file and the files it "
                                  "imports"),
                                 (1, "FP32 weights", "build_model() must return the same weights on every rank "
                                  "(seed its random initialisation or load saved weights)")):
            differ = [r for r, v in enumerate(found) if v[part] != found[0][part]]
            if differ:
                shown = ", ".join(f"rank {r}: {v[part][:12]}" for r, v in enumerate(found))
                ranks = ", ".join(str(r) for r in differ)
                raise UserCodeError(f"rank{'s' if len(differ) > 1 else ''} {ranks} built different {what} from "
                                    f"rank 0 ({shown}); {hint}")

    def _collective(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except RuntimeError as exc:  # torch.distributed's errors (DistBackendError, timeouts) are RuntimeErrors
            posted = self._posted()
            if posted is not None:  # another rank failed first: end as it says
                self._follow(posted)
            raise RankLost(f"rank {self.rank}: lost contact with the other ranks ({exc_line(exc)}); one of them "
                           f"was killed, ran out of memory, or took longer than {self.timeout:g} s "
                           f"({TIMEOUT_ENV})", original=exc) from exc

    # --- failure on any rank stops every rank ----------------------------------------------------------------
    def watch(self, report: Report, *, lost_code: int) -> None:
        """Start the watchdog: when another rank posts a failure, `report` it (on rank 0) and exit with its code.

        `lost_code` is the exit code when rank 0's store stops answering (rank 0 died without a word).
        """
        if not self.distributed or self._watchdog is not None:
            return
        self._report = report
        self._watchdog = threading.Thread(target=self._watch, args=(lost_code,), name="mpt-ranks-watchdog",
                                          daemon=True)
        self._watchdog.start()

    def _watch(self, lost_code: int) -> None:
        misses = 0
        while not self._stop.wait(POLL_SECONDS):
            try:
                posted = self._posted()
                misses = 0
            except Exception as exc:  # noqa: BLE001 - the store is gone when rank 0 ended
                misses += 1
                if misses < _LOST_POLLS or self._stop.is_set():
                    continue
                posted = Abort(lost_code, self.rank, f"lost contact with rank 0 ({exc_line(exc)}); all ranks "
                                                     "stopped", lost=True)
            if posted is not None:
                self._follow(posted)
                return

    def _posted(self) -> Abort | None:
        if self.store is None or not self.store.check([_ABORT_KEY]):
            return None
        return Abort.from_json(self.store.get(_ABORT_KEY))

    def _follow(self, posted: Abort) -> None:
        """Another rank failed: acknowledge, report it (rank 0) and end this process with its code."""
        if not self._exiting.acquire(blocking=False):
            return  # this rank is failing itself: that thread ends the process
        try:
            self.store.add(_ACKS_KEY, 1)
        except Exception:  # noqa: BLE001 - the poster stops waiting for acks after ACK_SECONDS anyway
            pass
        if self._report is not None and (self.is_main or posted.lost):
            self._report(posted)
        _record_for_torchrun(posted)
        end_process(posted.code)

    def abort(self, code: int, message: str, notes: tuple[str, ...] = (), *, report: Report) -> NoReturn:
        """This rank failed: post it for the others, report the first failure (rank 0) and exit with its code.

        When another rank posted first, every rank ends as that one said.
        """
        _ignore_signals()
        if not self._exiting.acquire(timeout=ACK_SECONDS):
            end_process(code)  # pragma: no cover - the watchdog is ending the process already
        mine = Abort(code, self.rank, message, tuple(notes))
        first = self._post(mine)
        if self.is_main:
            report(first)
        if first is mine:
            self._await_acks()
        _record_for_torchrun(first)
        end_process(first.code)

    def _post(self, mine: Abort) -> Abort:
        """Post `mine` unless another rank posted first; the failure every rank ends with."""
        try:
            if self.store.add(_COUNT_KEY, 1) == 1:
                self.store.set(_ABORT_KEY, mine.to_json())
                return mine
            self.store.wait([_ABORT_KEY], _dt.timedelta(seconds=ACK_SECONDS))
            first = Abort.from_json(self.store.get(_ABORT_KEY))
            self.store.add(_ACKS_KEY, 1)
            return first
        except Exception:  # noqa: BLE001 - the store is gone: report our own failure
            return mine

    def _await_acks(self) -> None:
        deadline = time.monotonic() + ACK_SECONDS
        while time.monotonic() < deadline:
            try:
                if self.store.add(_ACKS_KEY, 0) >= self.size - 1:
                    return
            except Exception:  # noqa: BLE001 - the store is gone: nobody is left to wait for
                return
            time.sleep(POLL_SECONDS / 4)

    def finish(self, code: int | None) -> int:
        """Every rank ends with rank 0's exit `code`; stops the watchdog and leaves the groups it created."""
        if not self.distributed:
            return code or 0
        import torch.distributed as dist

        code = self.broadcast(code) or 0
        self._stop.set()
        if self._watchdog is not None:
            self._watchdog.join()
        self._collective(dist.barrier, group=self.group)  # no watchdog polls a store that rank 0 takes down
        for group in reversed(self._owns):
            dist.destroy_process_group(None if group == "default" else group)
        return code


def _join(rank: int, size: int, device: str, seconds: float) -> tuple[Any, tuple[Any, ...]]:
    """Initialize the default process group unless the user did, and a gloo group for mpt's messages
    when the default one is not gloo: (that group or None, the groups created, "default" for the default)."""
    import torch.distributed as dist

    wait = _dt.timedelta(seconds=seconds)
    owns: list[Any] = []
    group = None
    try:
        if not dist.is_initialized():
            store = _rendezvous(rank, size, min(seconds, env_join_timeout()))
            store.set_timeout(wait)
            dist.init_process_group("cpu:gloo,cuda:nccl" if device == "cuda" else "gloo", timeout=wait,
                                    store=dist.PrefixStore("default_pg", store), rank=rank, world_size=size)
            owns.append("default")
        if dist.get_backend() != "gloo":
            group = dist.new_group(backend="gloo", timeout=wait)
            owns.append(group)
    except (RuntimeError, ValueError) as exc:
        raise RankLost(f"rank {rank}: could not join the other {size - 1} rank(s) within {seconds:g} s "
                       f"({exc_line(exc)}); are they all started, with the same MASTER_ADDR and MASTER_PORT?",
                       original=exc) from exc
    if dist.get_world_size() != size or dist.get_rank() != rank:
        raise ConfigError(f"the process group is rank {dist.get_rank()} of {dist.get_world_size()}, "
                          f"but RANK={rank} and WORLD_SIZE={size}")
    return group, tuple(owns)


def _rendezvous(rank: int, size: int, seconds: float) -> Any:
    """The store every rank meets at, once all `size` ranks have arrived; ConfigError after `seconds`.

    A group's join timeout is also its collectives' timeout (one `evaluate` may take many minutes), so
    the join is bounded here, on the store, before the group exists: a rank started alone (RANK=0 and
    WORLD_SIZE=2 by hand, or a rank that never came up) is exit 2 within `seconds`, not after
    MPT_DIST_TIMEOUT.
    """
    import torch.distributed as dist

    why = ""
    try:
        store, _, _ = next(dist.rendezvous("env://", rank=rank, world_size=size,
                                           timeout=_dt.timedelta(seconds=seconds)))
        store.set_timeout(_dt.timedelta(seconds=seconds))
        key = f"mpt/joined/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        arrived, deadline = store.add(key, 1), time.monotonic() + seconds
        while arrived < size and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
            arrived = store.add(key, 0)
        if arrived >= size:
            return store
        why = f"{arrived} of {size} ranks arrived"
    except (RuntimeError, ValueError) as exc:
        why = exc_line(exc, limit=160)
    raise ConfigError(f"rank {rank} of {size}: the other ranks did not join within {seconds:g} s "
                      f"({JOIN_TIMEOUT_ENV}; {why}): start every rank with "
                      f"`torchrun --nproc-per-node {size} --no-python mpt ...`")


def _probe_master(rank: int, size: int, seconds: float) -> None:
    """ConfigError when nothing listens at MASTER_ADDR:MASTER_PORT within `seconds`: rank 0 (or torchrun's
    store) is not there, and torch's own client would retry for the whole timeout, printing C++ frames."""
    host, port = os.environ["MASTER_ADDR"], env_int("MASTER_PORT", 0)
    deadline = time.monotonic() + seconds
    while True:
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(1.0, seconds))):
                return
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise ConfigError(f"rank {rank} of {size}: nothing answers at MASTER_ADDR:MASTER_PORT ({host}:{port}) "
                                  f"after {seconds:g} s ({exc.strerror or exc}): rank 0 is not running; start every "
                                  f"rank with `torchrun --nproc-per-node {size} --no-python mpt ...`") from None
        time.sleep(0.2)


def _store(wait: _dt.timedelta, *, own_client: bool) -> Any:
    """The process group's store, through a connection of mpt's own where it can: a store call blocked
    in the main thread (the user's code waiting on a key) holds its connection, and the watchdog must not wait."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "")
    if own_client and host and port.isdigit():  # env:// init: the default store is this TCPStore
        try:
            return dist.TCPStore(host, int(port), is_master=False, timeout=wait, wait_for_workers=False)
        except (RuntimeError, ValueError):
            pass
    return c10d._get_default_store()


def _same(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or abs(a - b) <= METRIC_RTOL * max(abs(a), abs(b))


def _ignore_signals() -> None:
    """A failing rank ends on its own terms: torchrun's SIGTERM to the survivors must not change its exit code."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            signal.signal(sig, signal.SIG_IGN)
        except ValueError:  # not the main thread
            pass


def _record_for_torchrun(abort: Abort) -> None:
    """torchrun's summary of failed workers shows this (TORCHELASTIC_ERROR_FILE) instead of "no traceback"."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    text = f"rank {abort.rank}: {abort.message} (all ranks stopped)"
    data = {"message": {"message": text, "extraInfo": {"py_callstack": text, "timestamp": str(int(time.time()))}}}
    try:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(data, fh)
    except OSError:
        pass


class SharedJournal:
    """The journal as every rank sees it: rank 0 reads and writes the file and broadcasts what it read.

    The followers (journal None) skip the same journaled evaluations as rank 0, so `--resume` works under
    torchrun with the journal on rank 0's disk only.
    """

    def __init__(self, journal: Journal | None, ranks: Ranks) -> None:
        if (journal is None) == ranks.is_main:
            raise ValueError("rank 0, and only rank 0, holds the journal")
        self.journal = journal
        self.ranks = ranks

    def get(self, key: str) -> dict[str, Any] | None:
        return self.ranks.broadcast(self.journal.get(key) if self.journal else None)

    def append(self, key: str, record: dict[str, Any]) -> None:
        if self.journal:
            self.journal.append(key, record)

    def save_inputs(self, inputs: ModelInputs | tuple) -> bool:
        return self.ranks.broadcast(self.journal.save_inputs(inputs) if self.journal else False)

    def load_inputs(self) -> ModelInputs | None:
        return self.ranks.broadcast(self.journal.load_inputs() if self.journal else None)

"""Test model file for tuning under torchrun: a planted chain whose evaluate shards its data across ranks.

With torch.distributed initialized, each rank evaluates its contiguous shard
of a fixed, seeded data set and all-reduces the count of correct predictions,
so every rank returns the same accuracy; in one process it evaluates
everything. The planted chain (tuner.testing) has two op instances that
must stay FP32, so the search has work to do.

Test switches (environment):
  MPT_TEST_COUNT=PATH     each evaluate() call appends a line to PATH.<rank>
  MPT_TEST_RAISE=R:N      rank R raises ValueError at its Nth evaluate() call
  MPT_TEST_NO_REDUCE=1    forget the all-reduce: each rank returns its own shard's count
  MPT_TEST_HANG=R:N       rank R hangs (sleeps an hour) at its Nth evaluate() call
  MPT_TEST_SLEEP=S        each evaluate() call sleeps S seconds first (to interrupt a run)
  MPT_TEST_RANK_WEIGHTS=1 build_model() on a rank other than 0 perturbs the weights (seeded by RANK)
"""
import os
import time

import torch
import torch.distributed as dist

from tuner.testing import PlantedTask

_TASK = PlantedTask(16, 2, samples=256)
_calls = 0


def _rank_and_size() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def build_model():
    model = _TASK.build()
    rank = int(os.environ.get("RANK", "0"))
    if os.environ.get("MPT_TEST_RANK_WEIGHTS") and rank > 0:
        g = torch.Generator().manual_seed(rank)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * torch.randn(p.shape, generator=g))
    return model


def evaluate(model):
    global _calls
    _calls += 1
    rank, size = _rank_and_size()
    count = os.environ.get("MPT_TEST_COUNT")
    if count:
        with open(f"{count}.{rank}", "a", encoding="utf-8") as fh:
            fh.write("eval\n")
    time.sleep(float(os.environ.get("MPT_TEST_SLEEP", "0")))
    here = [str(rank), str(_calls)]
    if os.environ.get("MPT_TEST_RAISE", "").split(":") == here:
        raise ValueError(f"planted failure on rank {rank}")
    if os.environ.get("MPT_TEST_HANG", "").split(":") == here:
        time.sleep(3600)
    x, labels = torch.tensor_split(_TASK.x, size)[rank], torch.tensor_split(_TASK.labels, size)[rank]
    with torch.no_grad():
        correct = (model(x).argmax(-1) == labels).sum().to(torch.float64)
    if size > 1 and not os.environ.get("MPT_TEST_NO_REDUCE"):
        dist.all_reduce(correct)  # the sum of every rank's correct predictions
    elif size > 1:
        return float(correct)  # the bug the test plants: each rank's own count
    return float(correct) / len(_TASK.labels)


def example_inputs():
    return (_TASK.x[:32],)

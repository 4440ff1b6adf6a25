"""Test model file for sharded models under torchrun: the planted chain of dist_model.py, sharded.

MPT_TEST_SHARD picks how build_model() shards it over a CPU mesh of every rank
(gloo), built collectively on every rank:
  fsdp   FSDP2: `fully_shard` on every linear and on the root
  tp     tensor parallel: `parallelize_module`, each chain linear column-wise
         with a replicated output, the head row-wise from a replicated input
  hsdp   FSDP2 over a 2-D mesh (1 x world): mpt refuses it
  (unset) the plain model, in one process or replicated on every rank
MPT_TEST_RAISE=R:N makes rank R raise at its Nth evaluate() call; MPT_TEST_KILL=R:N kills it there.
MPT_TEST_EXIT=PATH: build_model() registers an exit handler that writes PATH.atexit.<rank>, and an object
that writes PATH.final.<rank> when the interpreter's teardown destroys it.
"""
import atexit
import os
import signal

import torch
import torch.distributed as dist

from tuner.testing import PlantedTask

_TASK = PlantedTask(8, 2, samples=256)
_calls = 0


class _Finalized:
    """Writes `path` when destroyed: at the interpreter's teardown, as a module global."""

    def __init__(self, path, _open=open):
        self.path, self._open = path, _open  # open bound now: the teardown clears builtins

    def __del__(self):
        with self._open(self.path, "w") as f:
            f.write("finalized\n")


def _mark_exit(path):
    rank = os.environ.get("RANK", "0")
    atexit.register(lambda: open(f"{path}.atexit.{rank}", "w").write("atexit\n"))
    globals()["_finalized"] = _Finalized(f"{path}.final.{rank}")


def build_model():
    if os.environ.get("MPT_TEST_EXIT") and "_finalized" not in globals():
        _mark_exit(os.environ["MPT_TEST_EXIT"])
    model = _TASK.build()
    how = os.environ.get("MPT_TEST_SHARD", "")
    if not how or not dist.is_initialized():
        return model
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    if how == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for lin in [*model.chain, *model.branches, model.head]:
            fully_shard(lin, mesh=mesh, reshard_after_forward=True)
        fully_shard(model, mesh=mesh)
    elif how == "hsdp":
        from torch.distributed.fsdp import fully_shard

        fully_shard(model, mesh=init_device_mesh("cpu", (1, dist.get_world_size()), mesh_dim_names=("r", "s")))
    elif how == "tp":
        from torch.distributed.tensor import Replicate
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        plan = {f"chain.{i}": ColwiseParallel(output_layouts=Replicate()) for i in range(len(model.chain))}
        plan["head"] = RowwiseParallel(input_layouts=Replicate())
        parallelize_module(model, mesh, plan)
    return model


def evaluate(model):
    global _calls
    _calls += 1
    here = [str(dist.get_rank() if dist.is_initialized() else 0), str(_calls)]
    if os.environ.get("MPT_TEST_RAISE", "").split(":") == here:
        raise ValueError(f"planted failure on rank {here[0]}")
    if os.environ.get("MPT_TEST_KILL", "").split(":") == here:
        os.kill(os.getpid(), signal.SIGKILL)
    # Every rank runs the whole data (the sharded model's forward is collective); the metric is the same.
    with torch.no_grad():
        correct = (model(_TASK.x).argmax(-1) == _TASK.labels).sum().to(torch.float64)
    return float(correct) / len(_TASK.labels)


def example_inputs():
    return (_TASK.x[:32],)

"""Run under torchrun (2 ranks): load each tuned folder into the model sharded as it was tuned, print the metric.

Arguments: RESULTS SHARD:FOLDER ... (SHARD as sharded_model.py's MPT_TEST_SHARD). Each rank writes
RESULTS.<rank>: one JSON line per folder, {"rank", "folder", "metric", "dtypes", "rounded"} (the dtypes of
the loaded model's local shards; "rounded": which of chain.0.weight and branches.0.weight hold values a
bf16 holds exactly, as the checkpoint stores a lowered parameter).
"""
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
import sharded_model

import tuner
from tuner.core.sharding import local_tensor

dist.init_process_group("gloo")
found = []
for arg in sys.argv[2:]:
    shard, folder = arg.split(":", 1)
    os.environ["MPT_TEST_SHARD"] = shard
    model = tuner.load(sharded_model.build_model(), folder)
    metric = sharded_model.evaluate(model)
    dtypes = sorted({str(local_tensor(t).dtype) for t in model.state_dict().values()})
    rounded = [name for name in ("chain.0.weight", "branches.0.weight")
               if torch.equal(w := local_tensor(model.state_dict()[name]), w.bfloat16().float())]
    found.append(json.dumps({"rank": dist.get_rank(), "folder": folder, "metric": metric, "dtypes": dtypes,
                             "rounded": rounded}))
Path(f"{sys.argv[1]}.{dist.get_rank()}").write_text("\n".join(found) + "\n")
dist.barrier()
dist.destroy_process_group()
# The FSDP2 models keep the gloo group alive past destroy_process_group (its threads still run); torn down
# at interpreter exit it intermittently aborts the process (exit -6) after the work is done. End at once,
# as `mpt` itself does under torchrun (cli/main.py).
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)

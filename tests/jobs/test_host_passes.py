"""A tune reads the weights' bytes on the host once, for the checkpoint (whose check reads no tensor back).

On a GPU every host-side look at the weights is a copy off the device: checksums per evaluation, a sha256 of
the state dict, the keeper's comparisons (issue 33: 9,111 `.cpu()` copies, a fifth of the tune). On the CPU
the same code paths are counted here: every `.cpu()` and `.numpy()` of a tensor as large as the model's big
weight (in FP32 or lowered), outside the CPU-only in-place lowering (`tuner.measure.packed`, which on a GPU
is a torch op on the device). Change detection must run where the weights live (torch reductions, version
counters), so only the checkpoint writer remains (one `.numpy()`; its check reads the file's header alone).
"""
from __future__ import annotations

import sys
import textwrap
from collections import Counter
from pathlib import Path

import torch
from click.testing import CliRunner

from mpt_cli.main import main

WIDTH = 384  # the big weight: 384 x 384 FP32 = 576 KiB, no other tensor of the run comes near its size

MODEL = f"""
import torch
from torch import nn

X = torch.randn(16, {WIDTH}, generator=torch.Generator().manual_seed(1))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.big = nn.Linear({WIDTH}, {WIDTH})
        self.mid = nn.Linear({WIDTH}, 16)
        self.proto = nn.Parameter(torch.randn(4, 16))

    def forward(self, x):
        h = torch.relu(self.mid(torch.relu(self.big(x))))
        # a fragile op: bf16 rounding of 1000 + small swamps the signal, so the search has work to do
        return torch.cdist(h + 1000.0, self.proto + 1000.0)


def build_model():
    torch.manual_seed(0)
    return Model().eval()


def example_inputs():
    return (X,)
"""


def _count_host_passes(monkeypatch) -> Counter:
    """Patch `Tensor.cpu` and `Tensor.numpy` to count calls on tensors of the big weight's size or more, by
    (method, the calling file's name)."""
    big = WIDTH * WIDTH * 2  # bytes of the big weight in bf16: its FP32 form is twice that
    seen: Counter = Counter()
    for method in ("cpu", "numpy"):
        original = getattr(torch.Tensor, method)

        def counted(self, *args, _original=original, _method=method, **kwargs):
            caller = Path(sys._getframe(1).f_code.co_filename)
            if self.numel() * self.element_size() >= big and not caller.as_posix().endswith("tuner/measure/packed.py"):
                seen[(_method, caller.name)] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, method, counted)
    return seen


def test_a_tune_reads_the_weights_on_the_host_only_for_the_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent(MODEL))
    seen = _count_host_passes(monkeypatch)
    res = CliRunner().invoke(main, ["tune", str(path), "--out", str(tmp_path / "out"), "--metric", "rel-error",
                                    "--tolerance", "1e-6", "--no-latency"])
    assert res.exit_code == 0, res.output
    evals = int(res.output.rsplit(" evaluations", 1)[0].rsplit(" ", 1)[-1])
    assert evals >= 3  # the search ran trials (each one used to cost a checksum pass or more)
    assert (tmp_path / "out" / "model.safetensors").is_file()
    # Only the checkpoint looks at the bytes on the host: its writer turns each tensor into bytes once (a tensor
    # off the CPU comes to the host in a group of tensors first: one copy per group), and the check after writing
    # reads no tensor back (the file is hashed as written, its header read back).
    assert {where for _, where in seen} <= {"safetensors_write.py"}, dict(seen)
    assert seen[("numpy", "safetensors_write.py")] == 1, dict(seen)

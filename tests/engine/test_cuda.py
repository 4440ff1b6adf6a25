"""CUDA path: the torch-cuda preset against torch.autocast("cuda", float16). Skipped without a GPU."""
import pytest
import torch
import torch.nn.functional as F

import tuner

pytestmark = pytest.mark.gpu


def _cases():
    d = "cuda"
    r = lambda *s: torch.randn(*s, device=d)  # noqa: E731
    return [
        ("linear", F.linear, (r(4, 8), r(3, 8))),
        ("matmul", torch.matmul, (r(4, 8), r(8, 2))),
        ("conv2d", F.conv2d, (r(1, 2, 5, 5), r(3, 2, 3, 3))),
        ("softmax", lambda x: torch.softmax(x, -1), (r(4, 8).half(),)),
        ("layer_norm", lambda x: F.layer_norm(x, (8,)), (r(4, 8).half(),)),
        ("exp", torch.exp, (r(4).half(),)),
        ("addcmul", torch.addcmul, (r(4), r(4).half(), r(4))),
        ("mse_loss", F.mse_loss, (r(4).half(), r(4).half())),
    ]


@pytest.mark.parametrize("idx", range(8))
def test_torch_cuda_preset_matches_torch_autocast(idx):
    name, fn, args = _cases()[idx]
    with torch.autocast("cuda", dtype=torch.float16):
        expected = fn(*args)
    with tuner.autocast("torch-cuda", "fp16", engine="python"):
        got = fn(*args)
    assert got.dtype == expected.dtype, name
    torch.testing.assert_close(got.float(), expected.float(), rtol=1e-3, atol=1e-3)


def test_tune_on_cuda_planted():
    from tuner.testing import PlantedTask
    from tuner.search.session import tune
    from tuner.options.tune import TuneOptions

    task = PlantedTask(16, 1)
    task.x = task.x.cuda()
    task.labels = task.labels.cuda()
    res = tune(task.build, task.evaluate, lambda: (task.x[:8],), TuneOptions(dtype="bf16", device="cuda"))
    assert res.status == "ok"


@pytest.mark.parametrize("rnn", [torch.nn.LSTM, torch.nn.GRU])
def test_a_cudnn_rnn_is_claimed_as_it_runs(rnn):
    """Issue 44: cuDNN's RNN runs in float16 under torch.autocast("cuda", bfloat16); the claims say so."""
    from tuner import Plan
    from tuner.measure.deployed import gemm_mismatches, observe
    from tuner.measure.recorded import record_plan

    class LM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.rnn, self.head = torch.nn.Embedding(20, 8), rnn(8, 8, batch_first=True), \
                torch.nn.Linear(8, 20)

        def forward(self, ids):
            return self.head(self.rnn(self.embed(ids))[0])

    model = LM().cuda().eval()
    inputs = (torch.randint(0, 20, (2, 5), device="cuda"),)
    plan = Plan(dtype="bf16", preset="torch-cuda")
    record, seen = record_plan(model, plan, inputs), observe(model, plan, inputs)
    assert gemm_mismatches(seen.gemms, record.claimed, record.tolerated) == []
    assert record.claimed["rnn"] == seen.gemms["rnn"] == {torch.float16}
    assert abs(record.shares.flop_share - seen.flop_share) < 1e-9

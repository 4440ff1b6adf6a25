"""`mpt check` of a training plan (`mpt tune --for-training`, issue 41) evaluates it as the tune's trials ran: the
model rebuilt with the same draws (an unseeded build_model included), FP32 weights, no checkpoint to load."""
from mpt_cli import exitcodes
from mpt_cli.main import main

MODEL = '''
import torch
from torch import nn
from torch.nn import functional as F

G = torch.Generator().manual_seed(5)
X = torch.randn(96, 8, generator=G)
Y = (X @ torch.randn(8, 3, generator=G)).argmax(1)


def build_model():  # unseeded: every trial (and check) builds it from the same generator state
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))


def evaluate(model):
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(12):
        idx = torch.randperm(64)[:16]
        loss = F.cross_entropy(model(X[idx]), Y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        return float((model(X[64:]).argmax(1) == Y[64:]).float().mean())


def example_inputs():
    return X[:4]
'''


def test_a_training_plan_checks_on_fp32_weights_with_the_same_draws(tmp_path, runner, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.py").write_text(MODEL)
    res = runner.invoke(main, ["tune", "model.py", "--for-training", "--tolerance", "0.2", "--no-latency", "-q"])
    assert res.exit_code == 0, res.output
    assert not (tmp_path / "mpt-out" / "model.safetensors").exists()
    res = runner.invoke(main, ["check", "mpt-out"])
    assert res.exit_code == 0 and "PASS" in res.output, res.output
    res = runner.invoke(main, ["check", "mpt-out", "--checkpoint"])
    assert res.exit_code == exitcodes.USAGE and "training plan has no model.safetensors" in res.output

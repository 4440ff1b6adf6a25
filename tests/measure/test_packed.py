"""A parameter packed into its own storage for a trial (bf16 values + residuals) comes back bit for bit, at
the same address and version, and is refused where packing would be unsafe."""
import pytest
import torch
from torch import nn

import tuner.measure.packed as packed
from tuner.core.fingerprint import ModelState
from tuner.measure.deployed import stored_as
from tuner.measure.packed import pack


def awkward(n: int, seed: int) -> torch.Tensor:
    """Values over 12 decades, signed zeros, subnormals, values that round up to the next binade, and exact
    rounding ties (low half 0x8000), which round-to-nearest-even sends both ways."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * 10 ** torch.randint(-8, 4, (n,), generator=g).float()
    bits = x.view(torch.int32)
    bits[::7] = (bits[::7] & ~0xFFFF) | 0x8000
    bits[3::11] = bits[3::11] | 0xFFFF
    x[5::13] = -0.0
    x[6::17] = 1e-40
    return x


@pytest.mark.parametrize("chunk", [1000, 1 << 22])
def test_packed_parameter_computes_in_bf16_and_comes_back_bit_for_bit(monkeypatch, chunk):
    monkeypatch.setattr(packed, "_CHUNK", chunk)
    p = nn.Parameter(awkward(5005, 0).view(5, 1001))
    ref, ptr, version = p.data.clone(), p.data_ptr(), p._version
    undo = pack(p, torch.bfloat16)
    assert undo is not None
    assert p.dtype == torch.bfloat16 and p.data_ptr() == ptr and torch.equal(p.data, ref.to(torch.bfloat16))
    undo()
    assert p.dtype == torch.float32 and p.data_ptr() == ptr and p._version == version
    assert torch.equal(p.data.view(torch.int32), ref.view(torch.int32))


def test_pack_refuses_what_it_cannot_do_safely():
    p = nn.Parameter(torch.randn(8, 8))
    view = p.t()  # a forward that kept a view would read the packed bytes
    assert pack(p, torch.bfloat16) is None and p.dtype == torch.float32
    del view
    assert pack(nn.Parameter(torch.randn(8)), torch.float16) is None  # fp16 is not FP32's top half
    nan = nn.Parameter(torch.tensor([1.0, float("nan")]))  # bf16 makes every NaN one NaN: its residual is lost
    assert pack(nan, torch.bfloat16) is None and nan.dtype == torch.float32
    inf = nn.Parameter(torch.tensor([1.0, float("inf"), 3.4e38]))  # 3.4e38 rounds up to inf: residual in range
    ref = inf.data.clone()
    undo = pack(inf, torch.bfloat16)
    assert undo is not None and torch.isinf(inf.data).tolist() == [False, True, True]
    undo()
    assert torch.equal(inf.data.view(torch.int32), ref.view(torch.int32))
    assert pack(nn.Parameter(torch.randn(8, 8)[:, :4]), torch.bfloat16) is None  # not its whole storage


def test_stored_as_leaves_the_model_as_built_for_the_keeper():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64), nn.Linear(64, 8))
    model[2].weight.data = awkward(512, 1).view(8, 64)
    before = ModelState.capture(model)
    rounded = {n: p.data.to(torch.bfloat16) for n, p in model.named_parameters() if n in ("0.weight", "2.weight")}
    ptrs = {n: p.data_ptr() for n, p in model.named_parameters()}
    with stored_as(model, {"0.weight": torch.bfloat16, "2.weight": torch.bfloat16}):
        lowered = dict(model.named_parameters())
        assert all(torch.equal(lowered[n].data, r) for n, r in rounded.items())
        assert all(lowered[n].data_ptr() == ptrs[n] for n in rounded)  # packed in place, not copied
    assert ModelState.capture(model) == before  # same objects, addresses, versions and bytes: no rebuild


def test_a_pack_stopped_midway_leaves_every_bit_as_it_was(monkeypatch):
    """The refusal path (a residual out of range, which round-to-nearest never gives: forced here by a smaller
    bound) after some chunks were packed already: those are unpacked, the rest never touched."""
    monkeypatch.setattr(packed, "_CHUNK", 1000)
    monkeypatch.setattr(packed, "_TIE", 1 << 10)
    x = awkward(3000, 2)
    x[:2000] = x[:2000].to(torch.bfloat16).float()  # the first two chunks round exactly: residual 0
    p = nn.Parameter(x)
    ref = p.data.clone()
    assert pack(p, torch.bfloat16) is None
    assert p.dtype == torch.float32 and torch.equal(p.data.view(torch.int32), ref.view(torch.int32))

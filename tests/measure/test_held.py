"""HeldLowered: from one plan's lowered parameters to the next, only those whose dtype differs change, and
every FP32 bit comes back."""
import torch
from torch import nn

import tuner.measure.held as held_module
from tuner.core.fingerprint import ModelState
from tuner.measure.held import HeldLowered

BF16, FP16 = torch.bfloat16, torch.float16


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 4))


def ids(params: list[nn.Parameter]) -> list[int]:
    return [id(p) for p in params]


def test_the_next_plan_changes_only_the_parameters_whose_dtype_differs(monkeypatch):
    m = model()
    before = ModelState.capture(m)
    ref = {n: p.data.clone() for n, p in m.named_parameters()}
    packed: list[tuple[int, ...]] = []
    real_pack = held_module.pack
    monkeypatch.setattr(held_module, "pack", lambda p, d, s=None: packed.append(tuple(p.shape)) or real_pack(p, d, s))
    held = HeldLowered()
    assert ids(held.match(m, {"0.weight": BF16, "1.weight": BF16})) == ids([m[0].weight, m[1].weight])
    assert len(packed) == 2 and m[0].weight.dtype == BF16 and m[1].weight.dtype == BF16
    assert not held.match(m, {"0.weight": BF16, "1.weight": BF16})  # the same plan again: nothing to do
    assert len(packed) == 2
    # 0 goes back, 1 stays, 2 is held aside (fp16 cannot be packed)
    assert ids(held.match(m, {"1.weight": BF16, "2.weight": FP16})) == ids([m[0].weight, m[2].weight])
    assert len(packed) == 3 and m[0].weight.dtype == torch.float32 and m[1].weight.dtype == BF16
    assert m[2].weight.dtype == FP16 and torch.equal(m[2].weight.data, ref["2.weight"].to(FP16))
    assert torch.equal(m[0].weight.data.view(torch.int32), ref["0.weight"].view(torch.int32))
    assert held.dtypes == {"1.weight": BF16, "2.weight": FP16}
    assert held.release() and not held.release()
    assert ModelState.capture(m) == before  # same objects, addresses, versions and bytes


def test_a_parameter_already_in_its_dtype_and_a_forgotten_record_are_left_alone():
    m = model()
    m[2].weight.data = m[2].weight.data.to(BF16)
    held = HeldLowered()
    assert not held.match(m, {"2.weight": BF16})
    assert held.match(m, {"0.weight": BF16})
    held.forget()  # the model it was made for is gone: nothing is put back
    assert held.dtypes == {} and not held.release() and m[0].weight.dtype == BF16


def test_a_change_of_plan_makes_its_buffers_once_not_once_per_parameter(monkeypatch):
    """Packing and unpacking work in buffers the size of a parameter: made once per change of plan and reused
    by each parameter (a fresh buffer per parameter cost more in page faults than the packing itself: GPT-2
    774M, 11 s a packing on a loaded CPU, 2 s with one buffer)."""
    import numpy as np

    import tuner.measure.packed as packed

    made: list[int] = []

    class Counting:  # numpy, counting the buffers of a parameter's size it is asked for
        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            return getattr(np, name)

        def empty(self, shape, *args, **kwargs):  # type: ignore[no-untyped-def]
            if int(np.prod(shape)) == 64 * 64:
                made.append(1)
            return np.empty(shape, *args, **kwargs)

    monkeypatch.setattr(packed, "np", Counting())
    torch.manual_seed(0)
    m = nn.Sequential(*(nn.Linear(64, 64, bias=False) for _ in range(8)))
    ref = {n: p.data.clone() for n, p in m.named_parameters()}
    held = HeldLowered()
    held.match(m, {n: BF16 for n in ref})
    assert all(p.dtype == BF16 for p in m.parameters())
    packing = len(made)
    assert held.release()
    assert all(torch.equal(p.data.view(torch.int32), ref[n].view(torch.int32)) for n, p in m.named_parameters())
    assert packing <= 1 and len(made) <= 2  # 8 parameters: one buffer to pack them, one to put them back


def test_a_mapped_parameter_is_held_in_a_kept_copy_and_its_file_pages_are_never_written(tmp_path):
    """Weights mapped copy-on-write from a file (an hf: folder, `torch.load(mmap=True)`) are not packed in place
    (every page copied at the first write): held in a lowered copy, made once and given back to the next plan
    that holds them; a write to that copy while it is not held is caught (a new copy is made)."""
    torch.save(model().state_dict(), tmp_path / "w.pt")
    m = model()
    m.load_state_dict(torch.load(tmp_path / "w.pt", mmap=True), assign=True)
    fp32 = {n: (p.data_ptr(), p.data.clone()) for n, p in m.named_parameters()}
    lowered = {"0.weight": BF16, "1.weight": BF16}
    held = HeldLowered()
    held.match(m, lowered)
    first = m[0].weight.data
    assert first.dtype == BF16 and first.data_ptr() != fp32["0.weight"][0]  # not in the file's pages
    assert torch.equal(first, fp32["0.weight"][1].to(BF16))
    held.match(m, {})
    assert all(p.data_ptr() == fp32[n][0] and torch.equal(p.data, fp32[n][1]) for n, p in m.named_parameters())
    held.match(m, lowered)
    assert m[0].weight.data.data_ptr() == first.data_ptr()  # the same copy: nothing converted again
    held.match(m, {})
    first.mul_(2.0)  # a reference kept from the loan, written while the copy is not held
    held.match(m, lowered)
    assert torch.equal(m[0].weight.data, fp32["0.weight"][1].to(BF16))
    assert held.release()
    assert all(p.data_ptr() == fp32[n][0] and torch.equal(p.data.view(torch.int32), fp32[n][1].view(torch.int32))
               for n, p in m.named_parameters())


def test_a_parameter_mapped_shared_from_a_file_never_writes_the_file(tmp_path):
    """A shared mapping's writes reach the file: packing in place would leave the user's weights file packed for
    as long as the plan holds them (and broken by an interrupt)."""
    import mmap

    from tuner.core.fingerprint import sha256_file

    torch.save(model().state_dict(), tmp_path / "w.pt")
    digest = sha256_file(tmp_path / "w.pt")
    m = model()
    torch.serialization.set_default_mmap_options(mmap.MAP_SHARED)
    try:
        m.load_state_dict(torch.load(tmp_path / "w.pt", mmap=True), assign=True)
    finally:
        torch.serialization.set_default_mmap_options(mmap.MAP_PRIVATE)
    held = HeldLowered()
    held.match(m, {"0.weight": BF16, "2.weight": BF16})
    assert m[0].weight.dtype == BF16 and sha256_file(tmp_path / "w.pt") == digest
    assert held.release() and sha256_file(tmp_path / "w.pt") == digest

"""Files written and read past the page cache: the bytes are the file's whether O_DIRECT is taken or refused."""
from __future__ import annotations

import errno
import fcntl
import os

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import tuner.core.direct_io as dio
from tuner.core.direct_io import DirectWriter, read_chunks
from tuner.core.fingerprint import sha256_file
from tuner.core.safetensors_write import Written, read_safetensors, write_safetensors


def _payload(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


@pytest.mark.parametrize("size", [0, 1, 4096, 3 * 4096 + 17])
def test_a_writer_stages_across_chunks_and_writes_the_tail(tmp_path, size):
    data = _payload(size)
    path = tmp_path / "f.bin"
    with DirectWriter(path, chunk=8192) as out:
        out.write(data[:5])  # pieces that straddle the staging buffer's edge
        out.write(np.frombuffer(data[5:], dtype=np.uint8))
    assert path.read_bytes() == data
    assert out.written == size


def _refuse_direct(real):
    """`real` (os.write or os.preadv), refusing any transfer on a file opened with O_DIRECT, as a file
    system that takes the flag at open but not for a transfer does."""
    def transfer(fd, *args):
        if dio._O_DIRECT and fcntl.fcntl(fd, fcntl.F_GETFL) & dio._O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, *args)
    return transfer


def test_a_file_system_refusing_direct_transfers_gets_the_same_bytes_through_the_cache(tmp_path, monkeypatch):
    data = _payload(5 * 4096 + 3, seed=1)
    monkeypatch.setattr(dio.os, "write", _refuse_direct(os.write))
    monkeypatch.setattr(dio.os, "preadv", _refuse_direct(os.preadv))
    with DirectWriter(tmp_path / "f.bin", chunk=4096) as out:
        out.write(data)
    assert not out.direct
    assert (tmp_path / "f.bin").read_bytes() == data
    assert b"".join(bytes(c) for c in read_chunks(tmp_path / "f.bin", chunk=4096)) == data


def test_open_refusing_o_direct_falls_back_to_a_plain_open(tmp_path, monkeypatch):
    real = os.open

    def no_direct(path, flags, *args):
        if dio._O_DIRECT and flags & dio._O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(path, flags, *args)

    monkeypatch.setattr(dio.os, "open", no_direct)
    data = _payload(10_000, seed=2)
    with DirectWriter(tmp_path / "f.bin", chunk=4096) as out:
        out.write(data)
    assert not out.direct and (tmp_path / "f.bin").read_bytes() == data


@pytest.mark.parametrize("size", [0, 4095, 4096, 2 * 4096 + 1])
def test_read_chunks_gives_the_file_in_order(tmp_path, size):
    data = _payload(size, seed=3)
    (tmp_path / "f.bin").write_bytes(data)
    chunks = [bytes(c) for c in read_chunks(tmp_path / "f.bin", chunk=4096)]
    assert b"".join(chunks) == data
    assert all(len(c) == 4096 for c in chunks[:-1])


def test_chunk_sizes_that_are_not_whole_blocks_are_refused(tmp_path):
    with pytest.raises(ValueError, match="multiple of 4096"):
        DirectWriter(tmp_path / "f.bin", chunk=1000)
    with pytest.raises(ValueError, match="multiple of 4096"):
        next(read_chunks(tmp_path / "f.bin", chunk=0))


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"b": torch.randn(3, generator=g).bfloat16(), "a": torch.randn(2, 2, generator=g),
            "c": torch.arange(3), "z": torch.randn(5000, generator=g).half(), "empty": torch.zeros(0),
            "mask": torch.tensor([True, False, True]), "scalar": torch.tensor(3.0),
            "big": torch.randn(3_000_000, generator=g), "i8": torch.arange(-3, 3, dtype=torch.int8)}


def test_write_safetensors_gives_the_file_safetensors_writes(tmp_path):
    state = _state()
    save_file(state, str(tmp_path / "theirs.safetensors"), metadata={"format": "pt"})
    write_safetensors(state, tmp_path / "ours.safetensors", metadata={"format": "pt"})
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "theirs.safetensors").read_bytes()
    loaded = load_file(str(tmp_path / "ours.safetensors"))
    assert set(loaded) == set(state)
    assert all(loaded[k].dtype == v.dtype and torch.equal(loaded[k], v) for k, v in state.items())
    with safe_open(str(tmp_path / "ours.safetensors"), framework="pt") as fh:
        assert fh.metadata() == {"format": "pt"}


def test_a_dtype_the_writer_does_not_know_is_left_to_safetensors(tmp_path):
    shared = torch.randn(6)
    state = {"w": torch.randn(4).to(torch.float8_e4m3fn), "b": torch.randn(2), "tied": shared, "again": shared}
    written = write_safetensors(state, tmp_path / "m.safetensors")  # (tied: safetensors wants them apart)
    loaded = load_file(str(tmp_path / "m.safetensors"))
    assert loaded["w"].dtype == torch.float8_e4m3fn and torch.equal(loaded["w"].float(), state["w"].float())
    assert torch.equal(loaded["tied"], shared) and torch.equal(loaded["again"], shared)
    assert written.sha256 == sha256_file(tmp_path / "m.safetensors")


def test_tied_tensors_are_written_under_each_name_from_their_own_memory(tmp_path, monkeypatch):
    """mpt's writer takes a tensor shared by two names from its memory twice (no copy of a tied embedding,
    which safetensors' writer would need), and the digest it returns is the file's."""
    shared = torch.randn(64, 8)
    state = {"embed.weight": shared, "head.weight": shared, "bias": torch.randn(8)}
    monkeypatch.setattr(torch.Tensor, "clone", lambda *a, **k: pytest.fail("a tensor was copied"))
    written = write_safetensors(state, tmp_path / "m.safetensors")
    monkeypatch.undo()
    loaded = load_file(str(tmp_path / "m.safetensors"))
    assert all(torch.equal(loaded[k], v) for k, v in state.items())
    assert written == Written(sha256_file(tmp_path / "m.safetensors"), (tmp_path / "m.safetensors").stat().st_size)


def test_complex_tensors_of_every_width_round_trip_bit_for_bit(tmp_path):
    """complex64 is a safetensors dtype (mpt's writer gives safetensors' own bytes); complex128 and complex32
    have no name in the format and go as their real view, named in the metadata, and read back as themselves."""
    g = torch.Generator().manual_seed(3)
    state = {"c64": torch.randn(5, dtype=torch.complex64, generator=g), "w": torch.randn(3, generator=g),
             "c128": torch.randn(2, 7, dtype=torch.complex128, generator=g)[:, 1:],  # (offset into its storage)
             "c32": torch.randn(4, dtype=torch.complex64, generator=g).to(torch.complex32)}
    save_file({k: state[k] for k in ("c64", "w")}, str(tmp_path / "theirs.safetensors"), metadata={"format": "pt"})
    write_safetensors({k: state[k] for k in ("c64", "w")}, tmp_path / "ours.safetensors", metadata={"format": "pt"})
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "theirs.safetensors").read_bytes()
    write_safetensors(state, tmp_path / "all.safetensors", metadata={"format": "pt"})
    back = read_safetensors(tmp_path / "all.safetensors")
    assert set(back) == set(state)
    for name, t in state.items():
        assert back[name].dtype == t.dtype and torch.equal(back[name].view(torch.uint8), t.contiguous().view(
            torch.uint8)), name
    assert torch.equal((back["c128"] * back["c128"]).real, (state["c128"] * state["c128"]).real)  # kernels run on it


def test_a_non_contiguous_tensor_is_written_as_its_values(tmp_path):
    t = torch.randn(4, 3)
    write_safetensors({"t": t.t()}, tmp_path / "m.safetensors")
    assert torch.equal(load_file(str(tmp_path / "m.safetensors"))["t"], t.t())


def test_where_the_file_system_takes_o_direct_whole_chunks_go_direct(tmp_path):
    """The fast path is the one taken, not a silent fallback: on a file system that opens with O_DIRECT (ext4,
    xfs; not every tmpfs), whole chunks are written direct; only the tail goes through the cache."""
    try:
        os.close(os.open(tmp_path / "probe", os.O_WRONLY | os.O_CREAT | getattr(os, "O_DIRECT", 0)))
    except OSError:
        pytest.skip("this file system refuses O_DIRECT")
    if not dio._O_DIRECT:
        pytest.skip("no O_DIRECT on this system")
    data = _payload(2 * 8192 + 100, seed=4)
    with DirectWriter(tmp_path / "f.bin", chunk=8192) as out:
        out.write(data)
        assert out.direct and out.written == 2 * 8192  # two whole chunks flushed, direct
    assert not out.direct and out.written == len(data)  # the tail, 100 bytes, through the cache
    assert (tmp_path / "f.bin").read_bytes() == data


def test_tensors_off_the_cpu_come_to_the_host_in_groups_and_give_the_same_file(tmp_path, monkeypatch):
    """`grouped` runs the path a GPU's tensors take (one copy to the host per group of consecutive tensors, up to
    GROUP_BYTES, a larger one alone) on the CPU: the same bytes, the same digest, a copy per group, not per tensor."""
    import tuner.core.safetensors_write as sw

    state = {f"t{i}": torch.randn(8, generator=torch.Generator().manual_seed(i)) for i in range(40)}
    state["big"] = torch.randn(100)  # 400 bytes: past the group size below, alone
    plain = write_safetensors(state, tmp_path / "plain.safetensors")
    monkeypatch.setattr(sw, "GROUP_BYTES", 128)  # 4 tensors of 32 bytes a group
    copies = []
    real = torch.Tensor.cpu
    monkeypatch.setattr(torch.Tensor, "cpu", lambda self, *a, **k: copies.append(self.numel()) or real(self, *a, **k))
    grouped = write_safetensors(state, tmp_path / "grouped.safetensors", grouped=True)
    monkeypatch.undo()
    assert (tmp_path / "grouped.safetensors").read_bytes() == (tmp_path / "plain.safetensors").read_bytes()
    assert grouped == plain and plain.sha256 == sha256_file(tmp_path / "plain.safetensors")
    assert sorted(copies) == [128] * 10 + [400]  # 41 tensors, 11 copies

"""The fast weights checksum the keeper compares after every evaluation: it must see any write."""
import torch
from torch import nn

from tuner.core.fingerprint import ModelState, weights_checksum, weights_digest


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(300, 257), nn.BatchNorm1d(257), nn.Linear(257, 3))


def test_equal_weights_give_equal_checksums_across_models():
    assert weights_checksum(model()) == weights_checksum(model())


def test_a_write_through_data_that_bumps_no_version_counter_is_seen():
    m = model()
    before = ModelState.capture(m)
    version = m[0].weight._version
    m[0].weight.data[123, 45] += 1e-6
    assert m[0].weight._version == version  # the object graph alone cannot tell
    assert ModelState.capture(m) != before


def test_swapped_rows_and_a_changed_last_byte_are_seen():
    a, b = model(), model()
    w = b[0].weight.data
    w[[0, 200]] = w[[200, 0]].clone()
    assert weights_checksum(a) != weights_checksum(b)
    c = model()
    c[1].num_batches_tracked.add_(1)  # an int64 buffer: the odd-sized tail of a tensor counts too
    assert weights_checksum(a) != weights_checksum(c)
    d = model()
    d[2].bias.data[-1] = d[2].bias.data[-1].item() + 1.0
    assert weights_checksum(a) != weights_checksum(d)


def test_checksum_and_digest_agree_that_a_one_ulp_scale_is_a_change():
    a, b = model(), model()
    b[2].weight.data.mul_(1.0 + 2 ** -20)
    assert (weights_checksum(a) == weights_checksum(b)) == (weights_digest(a) == weights_digest(b)) is False


def test_a_capture_since_an_earlier_one_reads_only_the_changed_tensors_again():
    m = model()
    before = ModelState.capture(m)
    first = next(m.parameters())
    with torch.no_grad():
        first.data.add_(1.0)
    assert ModelState.capture(m, since=before, changed=[first]) == ModelState.capture(m) != before
    # a tensor the caller does not name is taken as unchanged: the caller's promise, not a look
    assert ModelState.capture(m, since=before).weights == before.weights

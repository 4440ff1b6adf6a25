"""The built-in fidelity metrics' arithmetic and the choice of the compared output."""
from __future__ import annotations

import math

import pytest
import torch

from tuner.core.errors import ConfigError
from tuner.measure import fidelity
from tuner.measure.fidelity import Frame, Layout, Metric, MetricSum, reference_of, select_output


def _metric(metric: Metric, ref: torch.Tensor, out: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    total = MetricSum(metric)
    frame = Frame(Layout.LAST, mask)
    total.add(out, frame, reference_of(metric, ref, frame))
    return total.value()


def test_directions_and_default_tolerances():
    assert [m.lower_is_better for m in Metric] == [False, False, True, True, True, True]
    assert Metric.AGREEMENT.default_tolerance == 0.01 and Metric.COSINE.default_tolerance == 0.001


def test_agreement_over_samples_for_a_classifier():
    ref = torch.tensor([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [0.0, 0.0, 1.0], [5.0, 0.0, 0.0]])
    out = ref.clone()
    out[1] = torch.tensor([4.0, 3.0, 1.0])  # one of four samples changes its top-1 class
    assert _metric(Metric.AGREEMENT, ref, ref) == 1.0
    assert _metric(Metric.AGREEMENT, ref, out) == 0.75


def test_agreement_over_tokens_leaves_out_padding():
    ref = torch.randn(2, 5, 7)
    out = ref.clone()
    out[1, 4] = -ref[1, 4]  # a padded token disagrees: not counted
    out[0, 0] = -ref[0, 0]  # a real token disagrees: counted
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1, 3:] = 0
    assert _metric(Metric.AGREEMENT, ref, out, mask) == pytest.approx(7 / 8)
    assert _metric(Metric.AGREEMENT, ref, out) == pytest.approx(8 / 10)


def test_cosine_kl_and_rel_error_against_direct_formulas():
    ref = torch.randn(6, 10)
    out = ref + 0.1 * torch.randn(6, 10)
    cos = torch.nn.functional.cosine_similarity(out, ref, dim=-1).mean()
    assert _metric(Metric.COSINE, ref, out) == pytest.approx(float(cos), rel=1e-6)
    p, q = ref.log_softmax(-1), out.log_softmax(-1)
    kl = (p.exp() * (p - q)).sum(-1).mean()
    assert _metric(Metric.KL, ref, out) == pytest.approx(float(kl), rel=1e-5)
    rel = (out - ref).norm() / ref.norm()
    assert _metric(Metric.REL_ERROR, ref, out) == pytest.approx(float(rel), rel=1e-6)
    assert _metric(Metric.KL, ref, ref) == pytest.approx(0.0, abs=1e-7) and _metric(Metric.REL_ERROR, ref, ref) == 0


def test_sums_over_batches_weigh_each_position_once():
    refs, outs = [torch.randn(3, 4), torch.randn(5, 4)], [torch.randn(3, 4), torch.randn(5, 4)]
    total = MetricSum(Metric.COSINE)
    for r, o in zip(refs, outs):
        total.add(o, Frame(Layout.LAST), reference_of(Metric.COSINE, r, Frame(Layout.LAST)))
    whole = torch.nn.functional.cosine_similarity(torch.cat(outs), torch.cat(refs), dim=-1).mean()
    assert total.value() == pytest.approx(float(whole), rel=1e-6)
    assert math.isnan(MetricSum(Metric.KL).value())


def test_agreement_needs_a_class_dimension():
    with pytest.raises(ConfigError, match="class dimension"):
        reference_of(Metric.AGREEMENT, torch.randn(4), Frame(Layout.LAST))


def test_select_output_default_and_dotted_paths():
    t = torch.randn(2, 3)
    assert select_output(t, None) is t
    hidden = torch.randn(2, 3, 4)
    out = {"last_hidden_state": hidden, "logits": t, "hidden_states": (hidden, t)}
    assert select_output(out, None) is t  # logits first
    assert select_output({"last_hidden_state": hidden}, None) is hidden
    assert select_output(out, "hidden_states.1") is t
    assert select_output((hidden, t), None) is hidden
    with pytest.raises(ConfigError, match="'logitz' is not a tensor") as info:
        select_output(out, "logitz")
    assert info.value.fields == ("output",)


def test_kl_of_an_output_against_itself_is_never_negative():
    """The FP32 reference's log-probabilities, computed another way, differ from the output's by rounding: the
    KL of the two is 0 to float precision, never the -1.6e-08 the sum of rounding errors gave."""
    y = torch.randn(16, 50, generator=torch.Generator().manual_seed(0)) * 4
    total = MetricSum(Metric.KL)
    total.add(y, Frame(Layout.LAST), torch.log_softmax(y.double(), dim=-1).float())
    assert 0 <= total.value() < 1e-7
    worse = MetricSum(Metric.KL)
    worse.add(y.bfloat16().float(), Frame(Layout.LAST), reference_of(Metric.KL, y, Frame(Layout.LAST)))
    assert worse.value() > total.value()  # a real difference still counts in full


@pytest.mark.plan
@pytest.mark.parametrize("metric", [Metric.COSINE, Metric.AGREEMENT, Metric.KL, Metric.REL_ERROR])
def test_an_output_against_itself_scores_exactly_the_ideal_value(metric):
    """The FP32 baseline is its outputs against themselves: exactly 1 (cosine, agreement) or 0 (kl, rel-error)
    on every CPU (issue 47). In float32, `cosine_similarity(y, y)` is below 1 for a third to half of these rows
    (its dot product and norms round apart; which rows depends on the CPU's kernels), and a zero row's is 0."""
    y = torch.randn(64, 1000, generator=torch.Generator().manual_seed(0)) * 4
    y[3] = 0
    ideal = 0.0 if metric.lower_is_better else 1.0
    assert _metric(metric, y, y) == ideal
    assert _metric(metric, y, y.clone()) == ideal  # equal values, another tensor: the same


def test_cosine_still_sees_a_difference_below_float32_resolution():
    """A row turned by 1e-4 rad has a cosine 1 - 5e-9, which float32 (its steps near 1 are 6e-8) rounds to 1 or
    to noise: in float64 it is there, as the exact formula gives it."""
    y = torch.randn(8, 100, generator=torch.Generator().manual_seed(0))
    out = y.clone()
    out[0, 0] += 1e-4 * float(y[0].norm())
    a, b = out.double(), y.double()
    exact = float(((a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))).mean())
    assert exact < 1 - 1e-10
    assert _metric(Metric.COSINE, y, out) == pytest.approx(exact, abs=1e-13)
    assert _metric(Metric.COSINE, y, -y) == -1.0


@pytest.mark.parametrize("metric", [Metric.COSINE, Metric.KL])
def test_the_float64_metrics_take_a_slice_of_rows_at_a_time_and_sum_alike(metric, monkeypatch):
    """An LM's logits are not copied whole to float64: a step of 3 rows' elements (some steps short) gives the
    sum of one step over all rows, to float64's rounding."""
    ref = torch.randn(10, 50, generator=torch.Generator().manual_seed(0))
    out = ref + 0.1 * torch.randn(10, 50, generator=torch.Generator().manual_seed(1))
    whole = _metric(metric, ref, out)
    monkeypatch.setattr(fidelity, "_CHUNK", 150)
    seen = []
    per_row = {Metric.COSINE: fidelity._cosine, Metric.KL: fidelity._kl}[metric]
    monkeypatch.setattr(fidelity, f"_{'cosine' if metric is Metric.COSINE else 'kl'}",
                        lambda *t: seen.append(t[0].shape[0]) or per_row(*t))
    assert _metric(metric, ref, out) == pytest.approx(whole, rel=1e-12) and seen == [3, 3, 3, 1]


def test_one_logit_per_position_is_a_binary_answer_and_has_no_cosine():
    """[batch, 1] (a binary classifier's logit): agreement compares signs, kl is the Bernoulli KL; the cosine of
    one number is only its sign, so it is refused."""
    ref = torch.tensor([[2.0], [-1.0], [0.5], [-3.0]])
    out = torch.tensor([[1.0], [1.0], [0.4], [-2.0]])  # the second sample changes sign
    assert _metric(Metric.AGREEMENT, ref, out) == 0.75
    p = torch.sigmoid(ref)
    q = torch.sigmoid(out)
    bernoulli = (p * (p / q).log() + (1 - p) * ((1 - p) / (1 - q)).log()).mean()
    assert _metric(Metric.KL, ref, out) == pytest.approx(float(bernoulli), rel=1e-5)
    with pytest.raises(ConfigError, match="one number per position"):
        _metric(Metric.COSINE, ref, out)

"""How shares are printed: whole percentages, but never a rounded 100% or 0% for a share that is not."""
from tuner.measure.shares import percent, share_text, short_text


def test_whole_percentages_where_they_are_exact_enough():
    assert percent(0.75) == "75%" and percent(1.0) == "100%" and percent(0.0) == "0%"
    assert short_text(0.62) == " 62% FLOPs"


def test_a_share_short_of_one_never_reads_100_percent():
    assert percent(0.9996) == "99.96%" and percent(0.996) == "99.6%"
    assert percent(0.999999) == ">99.99%" and percent(1e-7) == "<0.01%" and percent(0.004) == "0.4%"
    assert share_text(0.9996, 0.6, "bf16") == "99.96% of matmul/conv FLOPs (60% of op calls) in bf16"

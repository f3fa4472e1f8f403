"""The report's statistics: Student-t intervals over seeds, paired differences and the verdict rule."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from linvit.reproduce.stats import mean_interval, paired_difference, verdict, verdict_at_least


def test_interval_of_a_textbook_sample():
    out = mean_interval([1, 2, 3, 4, 5])  # mean 3, s = 1.5811, t(0.975, 4) = 2.7764
    assert out["mean"] == 3 and out["low"] == pytest.approx(1.03676, abs=1e-4)
    assert out["high"] == pytest.approx(4.96324, abs=1e-4)


@pytest.mark.parametrize("seed", range(5))
def test_interval_agrees_with_scipys_one_sample_t_test(seed):
    sample = np.random.default_rng(seed).normal(70, 3, size=3 + seed)
    ci = stats.ttest_1samp(sample, 0).confidence_interval(0.95)
    out = mean_interval(sample)
    assert (out["low"], out["high"]) == pytest.approx((ci.low, ci.high), rel=1e-12)
    wider = mean_interval(sample, confidence=0.99)
    assert wider["low"] < out["low"] and wider["high"] > out["high"]


def test_one_value_has_no_interval_and_none_is_an_error():
    assert mean_interval([81.5]) == {"n": 1, "values": [81.5], "mean": 81.5, "low": None, "high": None}
    with pytest.raises(ValueError):
        mean_interval([])


def test_paired_difference_pairs_by_seed_not_by_position():
    a = {0: 80.0, 1: 82.0, 2: 81.0}
    b = {2: 79.0, 0: 78.0, 1: 80.5, 7: 10.0}  # another order and a seed a lacks
    out = paired_difference(a, b)
    assert out["seeds"] == [0, 1, 2] and out["values"] == [2.0, 1.5, 2.0]
    ci = stats.ttest_rel([80.0, 82.0, 81.0], [78.0, 80.5, 79.0]).confidence_interval(0.95)
    assert (out["low"], out["high"]) == pytest.approx((ci.low, ci.high), rel=1e-12)
    with pytest.raises(ValueError, match="share no seed"):
        paired_difference({0: 1.0}, {1: 1.0})


@pytest.mark.parametrize(
    "low, high, expected",
    [
        (0.1, 2.0, "holds"),
        (-2.0, -0.1, "does not hold"),
        (-2.0, 0.0, "does not hold"),
        (0.0, 2.0, "inconclusive"),
        (-1.0, 1.0, "inconclusive"),
        (None, None, "inconclusive"),
    ],
)
def test_verdict_reads_only_the_interval(low, high, expected):
    assert verdict({"low": low, "high": high, "mean": 0.5}) == expected


@pytest.mark.parametrize(
    "low, high, expected",
    [
        (0.985, 0.99, "holds"),
        (0.90, 0.984, "does not hold"),
        (0.98, 0.99, "inconclusive"),
        (None, None, "inconclusive"),
    ],
)
def test_a_value_claim_is_judged_by_where_the_interval_lies_against_the_papers_value(low, high, expected):
    assert verdict_at_least({"low": low, "high": high, "mean": 0.985}, 0.985) == expected

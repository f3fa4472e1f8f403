"""Numbers over seeds, and the verdict on a claim, computed from them (issue 23's protocol).

Every number the report gives is a mean over seeds with a 95% Student-t interval; a comparison with the
baseline is a paired difference (the same seeds, so the seed's share of the noise cancels) with its own
interval. A paper's claim "A beats B" is judged by that interval alone:
    holds          the whole interval of A - B lies above 0
    does not hold  the whole interval lies at or below 0
    inconclusive   the interval contains 0, or there are fewer than two seeds (no interval)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scipy import stats

CONFIDENCE = 0.95
VERDICTS = ("holds", "does not hold", "inconclusive")


def mean_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> dict:
    """{"n", "values", "mean", "low", "high"}: the mean and its two-sided Student-t interval (None for n < 2)."""
    values = [float(v) for v in values]
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    mean = math.fsum(values) / n
    if n < 2:
        return {"n": n, "values": values, "mean": mean, "low": None, "high": None}
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = stats.t.ppf(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n)
    return {"n": n, "values": values, "mean": mean, "low": mean - half, "high": mean + half}


def paired_difference(a: dict[int, float], b: dict[int, float], confidence: float = CONFIDENCE) -> dict:
    """mean_interval of a[seed] - b[seed] over the seeds both have (keyed by seed, so pairs cannot slip)."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise ValueError("the two sets of runs share no seed")
    return {"seeds": seeds, **mean_interval([a[s] - b[s] for s in seeds], confidence)}


def verdict(difference: dict) -> str:
    """The claim "first beats second" judged by paired_difference's interval (see the module docstring)."""
    low, high = difference["low"], difference["high"]
    if low is None or high is None:
        return "inconclusive"
    if low > 0:
        return "holds"
    if high <= 0:
        return "does not hold"
    return "inconclusive"


def verdict_at_least(summary: dict, value: float) -> str:
    """The claim "the quantity reaches value" judged by its interval over seeds (same rule, shifted by value)."""
    low, high = summary["low"], summary["high"]
    if low is None or high is None:
        return "inconclusive"
    if low >= value:
        return "holds"
    if high < value:
        return "does not hold"
    return "inconclusive"

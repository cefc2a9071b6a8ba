"""kneeswarm.analysis.models.trend: the Mann–Kendall test, the Theil–Sen slope and the least-squares change point,
checked against scipy/numpy computed here on the same numbers and against series whose answer is
known by construction."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from kneeswarm.analysis.models import trend


def brute_change_point(z: list[float], min_seg: int) -> int:
    """The split (first index of the after segment) of least squared error, by brute force."""
    sse = {k: np.var(z[:k]) * k + np.var(z[k:]) * (len(z) - k) for k in range(min_seg, len(z) - min_seg + 1)}
    return min(sse, key=lambda k: (round(sse[k], 9), k))


def test_mann_kendall_s_counts_the_signs_of_every_pair():
    rng = np.random.default_rng(7)
    y = rng.normal(size=12)
    expected = sum(np.sign(y[j] - y[i]) for i, j in itertools.combinations(range(len(y)), 2))
    assert trend.mann_kendall_s(y) == expected
    # without ties, Kendall's tau is S over the number of pairs
    assert trend.mann_kendall_s(y) / math.comb(12, 2) == pytest.approx(stats.kendalltau(np.arange(12), y)[0])


def test_drift_of_a_rising_series_is_found_with_the_exact_p_and_the_median_slope():
    y = [20.0, 22.5, 24.0, 27.0, 28.5, 31.0]  # strictly rising: S = 15, exact two-sided p = 2 / 6!
    d = trend.drift(y, worse=+1)
    assert d["s"] == 15 and d["tau"] == pytest.approx(1.0)
    assert d["p"] == pytest.approx(2 / math.factorial(6))
    pair_slopes = [(y[j] - y[i]) / (j - i) for i, j in itertools.combinations(range(6), 2)]
    assert d["slope"] == pytest.approx(np.median(pair_slopes))
    assert d["change"] == pytest.approx(np.median(pair_slopes) * 5)
    assert d["rel_change"] == pytest.approx(d["change"] / np.median(y))
    assert d["drifting"] and d["direction"] == "worse"
    assert trend.drift(y, worse=-1)["direction"] == "better"  # a rising QPS is no regression


def test_theil_sen_ignores_one_outlier_of_a_known_line():
    y = [2 * x + 1 for x in range(8)]
    y[5] = 100.0  # one wild run
    d = trend.drift(y)
    assert d["slope"] == pytest.approx(2.0)
    assert d["p"] == pytest.approx(stats.kendalltau(np.arange(8), y)[1])


def test_no_drift_on_noise_a_small_creep_or_too_few_runs():
    rng = np.random.default_rng(3)
    noise = 50 + rng.normal(0, 1, size=20)
    assert not trend.drift(noise)["drifting"]
    creep = [100 + 0.2 * i for i in range(20)]  # significant (monotonic) but 3.8 % over the window
    d = trend.drift(creep)
    assert d["p"] < trend.DRIFT_ALPHA and d["rel_change"] < trend.MIN_RELATIVE_DRIFT and not d["drifting"]
    short = trend.drift([1.0, 2.0, 3.0, 4.0])
    assert short["p"] is None and not short["drifting"] and "at least" in short["reason"]
    assert not trend.drift([5.0] * 8)["drifting"]


def test_missing_values_are_left_out_of_the_test():
    y = [1.0, None, 2.0, 3.0, float("nan"), 4.0, 5.0]
    d = trend.drift(y)
    assert d["n"] == 5 and d["p"] == pytest.approx(stats.kendalltau([0, 2, 3, 5, 6], [1, 2, 3, 4, 5])[1])


def test_change_point_of_a_known_step_and_against_brute_force():
    cp = trend.change_point([20, 21, 20, 35, 36, 35])
    assert cp["index"] == 3 and cp["before"] == pytest.approx(61 / 3) and cp["after"] == pytest.approx(106 / 3)
    assert cp["explained"] > 0.95
    rng = np.random.default_rng(11)
    for _ in range(20):
        z = list(rng.normal(size=int(rng.integers(4, 15))))
        assert trend.change_point(z)["index"] == brute_change_point(z, trend.MIN_SEGMENT)


def test_change_point_on_a_drift_with_a_step_is_the_step():
    y = [20, 22, 24, 40, 42, 44]  # rising 2 per run, and 16 more from run 3 on
    assert trend.change_point(y)["index"] == 3


def test_change_point_counts_indexes_of_the_series_as_given():
    assert trend.change_point([1.0, None, 1.0, 9.0, None, 9.0])["index"] == 3
    assert trend.change_point([1.0, 2.0, 3.0]) is None  # too short for two segments of MIN_SEGMENT
    assert trend.change_point([4.0] * 6) is None

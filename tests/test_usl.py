"""fit_usl against known parameters and against published fits on their published data."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from kneeswarm.analysis.models.usl import describe, fit_usl, peak_of, usl_curve, usl_throughput

# Baron Schwartz, "Practical Scalability Analysis with the Universal Scalability Law"
# (VividCortex, 2015): the Cisco benchmark and the book's fitted model.  Data and coefficients
# as carried verbatim by two independent implementations' tests: codahale/usl4j
# src/test/java/com/codahale/usl4j/tests/ModelTest.java ("data of Cisco benchmark from Practical
# Scalability by Baron Schwartz", "listed values of the fitted model from the book") and
# codahale/usl model_test.go.
CISCO = [
    (1, 955.16), (2, 1878.91), (3, 2688.01), (4, 3548.68), (5, 4315.54), (6, 5130.43), (7, 5931.37),
    (8, 6531.08), (9, 7219.8), (10, 7867.61), (11, 8278.71), (12, 8646.7), (13, 9047.84), (14, 9426.55),
    (15, 9645.37), (16, 9897.24), (17, 10097.6), (18, 10240.5), (19, 10532.39), (20, 10798.52),
    (21, 11151.43), (22, 11518.63), (23, 11806), (24, 12089.37), (25, 12075.41), (26, 12177.29),
    (27, 12211.41), (28, 12158.93), (29, 12155.27), (30, 12118.04), (31, 12140.4), (32, 12074.39),
]
CISCO_SIGMA, CISCO_KAPPA, CISCO_LAMBDA = 0.02671591, 7.690945e-4, 995.6486
CISCO_N_MAX, CISCO_X_MAX = 35, 12341  # the book's N* (floored) and peak throughput

# SPEC SDM91, Sun SPARCcenter 2000 (16 CPUs), October 1994: simulated users -> scripts per hour,
# the R package `usl` data set `specsdm91` (source: N. J. Gunther, Guerrilla Capacity Planning,
# Springer 2007).  The .rda file is binary; these values are the ones the package's own saved
# test outputs imply: fitted(u) + residuals(u) in smoeding/usl tests/fitted.Rout.save and
# tests/residuals.Rout.save (90 - 25.10 = 64.9, 1078 - 81.66 ≈ 995.9, 1541 + 111.09 ≈ 1652.4,
# 1850 + 3.05 ≈ 1853.2, 1879 - 49.99 ≈ 1828.9, 1822 - 46.60 ≈ 1775.0, 1646 + 56.00 ≈ 1702.2).
SPECSDM91 = [(1, 64.9), (18, 995.9), (36, 1652.4), (72, 1853.2), (108, 1828.9), (144, 1775.0), (216, 1702.2)]
# The package's published fit (usl >= 2.0, nls with the scale factor free), smoeding/usl
# tests/summary.Rout.save and README.md: alpha 2.773e-02 (σ), beta 1.044e-04 (κ), gamma 9.000e+01
# (λ), Multiple R-squared 0.9896; tests/peak-scalability.Rout.save: signif(peak, 2) = 97;
# tests/fitted.Rout.save (digits = 3):
SDM_SIGMA, SDM_KAPPA, SDM_LAMBDA, SDM_R2, SDM_PEAK_N = 2.773e-02, 1.044e-04, 9.000e01, 0.9896, 97
SDM_FITTED = [90, 1078, 1541, 1850, 1879, 1822, 1646]

PUBLISHED_TOLERANCE = 0.01  # the acceptance bound: within 1% of a published fit
KNOWN_TOLERANCE = 0.05  # the acceptance bound: σ and κ within 5% on noisy data from known parameters


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


def test_reproduces_schwartz_cisco_fit_to_1_percent():
    fit = fit_usl(*zip(*CISCO))
    assert rel(fit["sigma"], CISCO_SIGMA) < PUBLISHED_TOLERANCE
    assert rel(fit["kappa"], CISCO_KAPPA) < PUBLISHED_TOLERANCE
    assert rel(fit["lambda"], CISCO_LAMBDA) < PUBLISHED_TOLERANCE
    assert math.floor(fit["n_star"]) == CISCO_N_MAX
    assert rel(fit["peak"], CISCO_X_MAX) < PUBLISHED_TOLERANCE
    assert fit["caution"] is None


def test_reproduces_usl_package_specsdm91_fit_to_1_percent():
    fit = fit_usl(*zip(*SPECSDM91))
    assert rel(fit["sigma"], SDM_SIGMA) < PUBLISHED_TOLERANCE
    assert rel(fit["kappa"], SDM_KAPPA) < PUBLISHED_TOLERANCE
    assert rel(fit["lambda"], SDM_LAMBDA) < PUBLISHED_TOLERANCE
    assert round(fit["r2"], 4) == SDM_R2
    assert float(f"{fit['n_star']:.2g}") == SDM_PEAK_N
    fitted = usl_throughput([n for n, _ in SPECSDM91], fit["sigma"], fit["kappa"], fit["lambda"])
    assert np.allclose(fitted, SDM_FITTED, rtol=0.001, atol=0.5)


@pytest.mark.parametrize("sigma,kappa,lam,seed", [
    (0.05, 0.002, 100.0, 1),   # retrograde inside the range (N* ≈ 22)
    (0.02, 0.0005, 50.0, 2),   # peak near the end of the range (N* ≈ 44)
    (0.10, 0.001, 300.0, 3),
])
def test_recovers_known_parameters_from_noisy_points(sigma, kappa, lam, seed):
    rng = np.random.default_rng(seed)
    n = np.arange(1, 65, dtype=float)
    # independent truth: the USL written out here, not the module's usl_throughput
    x = lam * n / (1 + sigma * (n - 1) + kappa * n * (n - 1))
    noisy = x * (1 + rng.normal(0, 0.005, n.size))
    fit = fit_usl(n, noisy)
    assert rel(fit["sigma"], sigma) < KNOWN_TOLERANCE
    assert rel(fit["kappa"], kappa) < KNOWN_TOLERANCE
    assert rel(fit["n_star"], math.sqrt((1 - sigma) / kappa)) < KNOWN_TOLERANCE
    assert fit["r2"] > 0.99


def test_amdahl_data_gives_no_n_star_and_the_asymptote():
    n = np.array([1, 2, 4, 8, 16, 32, 64], dtype=float)
    x = 10 * n / (1 + 0.1 * (n - 1))  # κ = 0: Amdahl, asymptote λ/σ = 100
    fit = fit_usl(n, x)
    assert fit["kappa"] < 1e-9
    assert fit["n_star"] is None and fit["peak_kind"] == "asymptote"
    assert rel(fit["peak"], 100.0) < 0.001
    assert peak_of(0.0, 0.0, 5.0) == (None, None, "none")


def test_linear_data_fits_sigma_and_kappa_zero():
    n = np.array([1, 2, 4, 8, 16], dtype=float)
    fit = fit_usl(n, 20 * n)
    assert fit["sigma"] < 1e-6 and fit["kappa"] < 1e-8
    assert rel(fit["lambda"], 20.0) < 1e-4


def test_caution_on_few_points_and_on_a_poor_fit():
    three = fit_usl([1, 2, 4], [10, 19, 35])
    assert three["sigma"] is not None and "3 points" in three["caution"]
    zigzag = fit_usl([1, 2, 4, 8, 16, 32], [100, 10, 120, 5, 110, 8])
    assert zigzag["r2"] is not None and zigzag["r2"] < 0.9
    assert "R²" in zigzag["caution"]


@pytest.mark.parametrize("users,qps", [
    ([], []), ([1, 2], [10, 20]), ([1, 2, None], [1, 2, 3]), ("abc", [1, 2, 3]), ([1, 2, 3], [0, -1, float("nan")]),
    ([1, 2, 3, 4], [1, 2]),
])
def test_bad_input_gives_a_caution_never_an_exception(users, qps):
    fit = fit_usl(users, qps)
    assert fit["sigma"] is None and fit["caution"]
    json.dumps(fit, allow_nan=False)


def test_curve_and_description():
    fit = fit_usl(*zip(*CISCO))
    curve = usl_curve(fit, 32, points=5)
    assert curve["users"] == [1.0, 8.75, 16.5, 24.25, 32.0]
    assert rel(curve["qps"][0], CISCO_LAMBDA) < PUBLISHED_TOLERANCE
    assert usl_curve({"sigma": None}, 32) == {"users": [], "qps": []}
    text = describe(fit)
    assert "N* = 35.6" in text and "contention" in text and "coherency" in text
    json.dumps(fit, allow_nan=False)


@pytest.mark.parametrize("sigma,kappa,lam", [(0.05, 0.002, 100.0), (0.0, 0.0, 20.0), (0.3, 0.0, 7.0), (0.02, 0.0005, 50.0)])
def test_the_numpy_truth_fit_recovers_exact_usl_curves(sigma, kappa, lam):
    """tests/usl_truth.py (numpy alone), the expected values of the summaries' USL tests
    (test_analysis_trust.py), recovers the parameters of exact curves and the published SDM91 fit."""
    from usl_truth import usl_lstsq

    n = np.array([1, 2, 4, 8, 16, 32, 64], dtype=float)
    got = usl_lstsq(n, lam * n / (1 + sigma * (n - 1) + kappa * n * (n - 1)))
    assert got["sigma"] == pytest.approx(sigma, rel=1e-6, abs=1e-9)
    assert got["kappa"] == pytest.approx(kappa, rel=1e-6, abs=1e-12)
    assert got["lambda"] == pytest.approx(lam, rel=1e-6)
    sdm = usl_lstsq(*zip(*SPECSDM91))
    assert rel(sdm["sigma"], SDM_SIGMA) < PUBLISHED_TOLERANCE and rel(sdm["kappa"], SDM_KAPPA) < PUBLISHED_TOLERANCE

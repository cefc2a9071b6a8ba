"""The Universal Scalability Law (Gunther): a three-number model of how throughput scales.

    X(N) = λ·N / (1 + σ·(N − 1) + κ·N·(N − 1))

* ``lambda`` (λ): the throughput of one user with no interference (requests/s per user);
* ``sigma`` (σ): contention, the serial share of the work (queueing on a lock, one stream, the
  GIL): with κ = 0 this is Amdahl's law and X levels off at λ/σ;
* ``kappa`` (κ): coherency, the cost of keeping parts consistent with each other (cache lines,
  shared state, context switches): it makes throughput fall again past N* — the retrograde region.

``fit_usl`` fits the three by bounded non-linear least squares (``scipy.optimize.curve_fit``,
method "trf"; σ and κ in [0, 1], λ > 0, started from σ = 0.01, κ = 1e-4, λ = X(N₁)/N₁, the
first point's throughput per user).  The peak of the fitted curve is at
N* = √((1 − σ)/κ).  Tests reproduce the published fits of Schwartz's Cisco benchmark and the R
package ``usl``'s SPEC SDM91 data set (tests/test_usl.py).
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import Any, Sequence

import numpy as np

from kneeswarm.analysis.schema.summary import UslCurve, UslFit

logger = logging.getLogger(__name__)

SIGMA_START = 0.01  # starting point of the fit (REFERENCE.md "USL fitting")
KAPPA_START = 1e-4
R2_POOR = 0.90  # below this the curve explains too little of the measured points to be read
MIN_POINTS_TRUSTED = 4  # fewer points than this fit three parameters with no check left
MIN_POINTS = 3  # three parameters need at least three points
# A fitted κ below this is 0 (the solver stops at ~1e-19, not exactly 0, on Amdahl-shaped
# data): its N* would be above a million users, outside anything a load test measures.
KAPPA_ZERO = 1e-12
MAX_EVALUATIONS = 20000
NEGLIGIBLE = 1e-9  # describe() writes smaller σ or κ as 0
CURVE_POINTS = 60  # points of the fitted curve handed to the report


def usl_throughput(n: Any, sigma: float, kappa: float, lam: float) -> np.ndarray:
    """X(N) of the USL for one or many N."""
    n = np.asarray(n, dtype=float)
    return lam * n / (1.0 + sigma * (n - 1.0) + kappa * n * (n - 1.0))


def _clean(users: Sequence[float], throughput: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """The finite points with N > 0 and X > 0, sorted by N."""
    try:
        n = np.asarray(list(users), dtype=float)
        x = np.asarray(list(throughput), dtype=float)
    except (TypeError, ValueError):
        return np.empty(0), np.empty(0)
    if n.shape != x.shape or n.ndim != 1:
        return np.empty(0), np.empty(0)
    keep = np.isfinite(n) & np.isfinite(x) & (n > 0) & (x > 0)
    order = np.argsort(n[keep], kind="stable")
    return n[keep][order], x[keep][order]


def _empty(points: int, caution: str) -> UslFit:
    return {"sigma": None, "kappa": None, "lambda": None, "n_star": None, "peak": None,
            "peak_kind": None, "r2": None, "points": points, "caution": caution}


def _solve(n: np.ndarray, x: np.ndarray) -> tuple[float, float, float]:
    """(σ, κ, λ) by bounded least squares; throughput is scaled to ~1 for the solver."""
    from scipy.optimize import curve_fit

    scale = float(x[0] / n[0])  # the starting λ: the first point's throughput per user
    y = x / scale
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # OptimizeWarning on a covariance that cannot be estimated
        popt, _ = curve_fit(usl_throughput, n, y, p0=[SIGMA_START, KAPPA_START, 1.0],
                            bounds=([0.0, 0.0, 1e-12], [1.0, 1.0, np.inf]), method="trf",
                            max_nfev=MAX_EVALUATIONS, ftol=1e-14, xtol=1e-14, gtol=1e-14)
    sigma, kappa, lam = (float(v) for v in popt)
    return sigma, (kappa if kappa > KAPPA_ZERO else 0.0), lam * scale


def _r2(n: np.ndarray, x: np.ndarray, sigma: float, kappa: float, lam: float) -> float | None:
    ss_tot = float(np.sum((x - x.mean()) ** 2))
    if ss_tot <= 0:
        return None
    ss_res = float(np.sum((x - usl_throughput(n, sigma, kappa, lam)) ** 2))
    return 1.0 - ss_res / ss_tot


def peak_of(sigma: float, kappa: float, lam: float) -> tuple[float | None, float | None, str]:
    """(N*, peak throughput, kind).

    κ > 0: N* = √((1 − σ)/κ) and the peak is X(N*) (kind "max").  κ = 0 (≤ KAPPA_ZERO): there is no maximum,
    N* is None and the peak is the asymptote λ/σ that X approaches but never reaches (kind
    "asymptote"); with σ = 0 too it scales linearly without bound (both None, kind "none").
    """
    if kappa > KAPPA_ZERO:
        n_star = math.sqrt(max(1.0 - sigma, 0.0) / kappa)
        return n_star, float(usl_throughput(n_star, sigma, kappa, lam)), "max"
    if sigma > 0:
        return None, lam / sigma, "asymptote"
    return None, None, "none"


def efficiency_users(sigma: float, kappa: float, efficiency: float) -> float | None:
    """The N where the USL's marginal efficiency (dX/dN over X/N: 1 − N·d′(N)/d(N), with
    d(N) = 1 + σ(N − 1) + κN(N − 1)) falls to ``efficiency`` (0 < e < 1), in closed form:
    (1 − e)·d(N) = N·d′(N) is κ(1 + e)N² + e(σ − κ)N − (1 − e)(1 − σ) = 0, its positive root
    (κ = 0: N = (1 − e)(1 − σ)/(eσ)).  None where it never falls that far (σ = κ = 0: linear)."""
    e = efficiency
    if kappa > KAPPA_ZERO:
        b = e * (sigma - kappa)
        return (-b + math.sqrt(b * b + 4 * kappa * (1 + e) * (1 - e) * (1 - sigma))) / (2 * kappa * (1 + e))
    if sigma > 0:
        return (1 - e) * (1 - sigma) / (e * sigma)
    return None


def fit_usl(users: Sequence[float], throughput: Sequence[float]) -> UslFit:
    """Fit the USL to (users, throughput) points; never raises.

    Returns ``{sigma, kappa, lambda, n_star, peak, peak_kind, r2, points, caution}``:

    * ``n_star`` = √((1 − σ)/κ), the concurrency of peak throughput; **None when κ is 0**
      (no retrograde region: throughput rises towards ``peak`` = λ/σ without reaching it,
      ``peak_kind`` "asymptote"; see ``peak_of``);
    * ``r2``: 1 − SS_res/SS_tot of the fitted curve over the points (None when all X are equal);
    * ``caution``: None, or one line saying why the numbers should not be leaned on (fewer than
      ``MIN_POINTS_TRUSTED`` points, R² below ``R2_POOR``, or no fit at all: then σ, κ, λ are None).

    Points with a non-finite or non-positive N or X are left out.
    """
    n, x = _clean(users, throughput)
    if len(n) < MIN_POINTS:
        return _empty(len(n), f"only {len(n)} usable point(s): the USL needs at least {MIN_POINTS}")
    try:
        sigma, kappa, lam = _solve(n, x)
    except (RuntimeError, ValueError) as exc:  # curve_fit gives up: say so rather than raise
        logger.info("USL fit failed: %s", exc)
        return _empty(len(n), f"the USL fit did not converge ({exc})")
    n_star, peak, kind = peak_of(sigma, kappa, lam)
    r2 = _r2(n, x, sigma, kappa, lam)
    cautions = []
    if len(n) < MIN_POINTS_TRUSTED:
        cautions.append(f"only {len(n)} points for 3 parameters")
    if r2 is not None and r2 < R2_POOR:
        cautions.append(f"R² {r2:.2f} < {R2_POOR:.2f}: the curve does not describe the points well")
    return {"sigma": sigma, "kappa": kappa, "lambda": lam, "n_star": n_star, "peak": peak, "peak_kind": kind,
            "r2": r2, "points": len(n), "caution": "; ".join(cautions) or None}


def usl_curve(fit: UslFit, n_max: float, points: int = CURVE_POINTS) -> UslCurve:
    """The fitted curve from N = 1 to ``n_max`` (for the report); empty lists without a fit."""
    sigma, kappa, lam = fit.get("sigma"), fit.get("kappa"), fit.get("lambda")
    if sigma is None or kappa is None or lam is None or not (isinstance(n_max, (int, float)) and n_max >= 1):
        return {"users": [], "qps": []}
    grid = np.linspace(1.0, float(n_max), max(int(points), 2))
    qps = usl_throughput(grid, sigma, kappa, lam)
    return {"users": [float(v) for v in grid], "qps": [float(v) for v in qps]}


def _g(x: float) -> str:
    """3 significant digits; a fitted value below NEGLIGIBLE reads as 0 (the solver's 1e-30 is no number to read)."""
    return "0" if abs(x) < NEGLIGIBLE else f"{x:.3g}"


def _rate(x: float) -> str:
    """A throughput for reading: 12,858 rather than 1.286e+04."""
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def describe(fit: UslFit) -> str | None:
    """One sentence reading σ as contention and κ as coherency cost, or None without a fit."""
    sigma, kappa, lam = fit.get("sigma"), fit.get("kappa"), fit.get("lambda")
    if sigma is None or kappa is None or lam is None:  # fit_usl gives all three or none
        return None
    s = (f"contention σ = {_g(sigma)} (the serial share of the work), coherency κ = {_g(kappa)} "
         f"(the cost of keeping threads consistent), λ = {lam:.3g}/s per user")
    peak, n_star = fit.get("peak"), fit.get("n_star")
    if fit.get("peak_kind") == "max" and peak is not None and n_star is not None:
        s += f"; predicted peak {_rate(peak)}/s at N* = {n_star:.1f} users"
    elif fit.get("peak_kind") == "asymptote" and peak is not None:
        s += f"; no retrograde region: throughput approaches {_rate(peak)}/s"
    return s

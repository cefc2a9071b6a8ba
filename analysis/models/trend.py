"""Trend statistics over a series of runs (the run history: slow drifts): is a figure drifting, and where
did it move?

``drift(values, worse)``: the Mann–Kendall trend test (Kendall's tau between the run order and the
values: ``scipy.stats.kendalltau``, exact p-value for small series without ties) with the Theil–Sen
slope (``scipy.stats.theilslopes``: the median of the pairwise slopes, per run).  A series
**drifts** when the test's two-sided p-value is below ``DRIFT_ALPHA`` AND the Theil–Sen line moves
at least ``MIN_RELATIVE_DRIFT`` of the series' median over the window: the p-value alone would flag
a 1 % creep that 30 quiet runs measure precisely and nobody cares about; the size alone would flag
one noisy run.  It drifted **worse** when the slope has the sign ``worse`` (+1 for latency, -1 for
throughput).

``change_point(values)``: the single change point of least squares (the first split of binary
segmentation with the L2 / normal-mean cost: Scott & Knott 1974, "A cluster analysis method for
grouping means in the analysis of variance"; as ``ruptures.Binseg(model="l2")`` or R
``changepoint::cpt.mean(method="BinSeg", Q=1)``): the split into a before and an after segment, each
of at least ``MIN_SEGMENT`` runs, whose two means leave the least squared error.  It returns the
index of the first run after the change, the two means and the share of the series' variance the
split explains.  A linear creep has a best split too (near its middle): the change point says where
the series moved most, the drift test says whether it moved at all.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Sequence

import numpy as np

from kneeswarm.analysis.schema.summary import ChangePoint, Trend

logger = logging.getLogger(__name__)

__all__ = ["drift", "change_point", "mann_kendall_s", "DRIFT_ALPHA", "MIN_RELATIVE_DRIFT", "MIN_RUNS",
           "MIN_SEGMENT"]

# Two-sided significance of the Mann–Kendall test: the usual 5 %.  With the exact distribution a
# series of 5 runs reaches it only when perfectly monotonic (p = 2/5! = 0.017), 6 runs with at most
# one swapped pair (p = 0.017).
DRIFT_ALPHA = 0.05
# The Theil–Sen line must move at least this share of the series' median across the window: the
# same bar as kneeswarm.analysis.runs.compare's QPS change (MIN_RELATIVE_CHANGE["qps"] = 10 %, measured there on
# repeated runs of the same configuration on this 2-core machine).
MIN_RELATIVE_DRIFT = 0.10
# Fewer runs than this give no drift verdict: 4 runs can reach p = 2/4! = 0.083 at best.
MIN_RUNS = 5
# Each side of a change point holds at least this many runs (when the series has 2 x that many):
# a single run on one side is an outlier, not a change.
MIN_SEGMENT = 2


def _clean(values: Sequence[float | None]) -> np.ndarray:
    return np.array([np.nan if v is None else float(v) for v in values], dtype=float)


def mann_kendall_s(values: Sequence[float]) -> int:
    """The Mann–Kendall statistic S = sum over i < j of sign(x_j - x_i)."""
    x = np.asarray(values, dtype=float)
    i, j = np.triu_indices(len(x), k=1)
    return int(np.sign(x[j] - x[i]).sum())


def drift(values: Sequence[float | None], worse: int = +1, x: Sequence[float] | None = None,
          alpha: float = DRIFT_ALPHA) -> Trend:
    """{n, s, tau, p, slope, slope_ci, change, rel_change, median, drifting, direction, reason} of a
    series in run order (None or NaN entries are left out).  ``x``: where each value lies (e.g. a
    soak window's mid time in seconds; the slope is then per unit of x), default the run index;
    ``alpha``: the test's significance (a soak tests several series at once: kneeswarm.analysis.summary.soak)."""
    y = _clean(values)
    xs = np.arange(len(y), dtype=float) if x is None else np.asarray(x, dtype=float)
    keep = np.isfinite(y) & np.isfinite(xs)
    xs, y = xs[keep], y[keep]
    out: Trend = {"n": int(len(y)), "s": None, "tau": None, "p": None, "slope": None, "slope_ci": None,
                           "change": None, "rel_change": None, "median": None, "drifting": False,
                           "direction": None, "alpha": alpha, "min_relative_drift": MIN_RELATIVE_DRIFT,
                           "reason": None}
    if len(y) < MIN_RUNS:
        out["reason"] = f"{len(y)} runs: the trend test needs at least {MIN_RUNS}"
        return out
    if np.ptp(y) == 0:
        out.update({"s": 0, "slope": 0.0, "change": 0.0, "rel_change": 0.0, "median": float(y[0]),
                    "reason": "constant series"})
        return out
    from scipy import stats  # here: 0.4 s of import that a run without a trend to test never pays

    tau, p = stats.kendalltau(xs, y)
    slope, _intercept, lo, hi = stats.theilslopes(y, xs)
    median = float(np.median(y))
    change = float(slope) * float(xs[-1] - xs[0])
    rel = change / abs(median) if median else math.inf
    drifting = bool(p < alpha and abs(rel) >= MIN_RELATIVE_DRIFT)
    out.update({"s": mann_kendall_s(y), "tau": float(tau), "p": float(p), "slope": float(slope),
                "slope_ci": [float(lo), float(hi)], "change": change, "rel_change": float(rel), "median": median,
                "drifting": drifting})
    if drifting:
        out["direction"] = "worse" if math.copysign(1, slope) == worse else "better"
    return out


def change_point(values: Sequence[float | None]) -> ChangePoint | None:
    """{index, before, after, shift, explained} of the single least-squares change point of the
    finite values (index counts in the series as given, None/NaN included), or None when the series
    is too short (2 x MIN_SEGMENT finite values) or constant."""
    y = _clean(values)
    where = np.flatnonzero(np.isfinite(y))
    z = y[where]
    n = len(z)
    if n < 2 * MIN_SEGMENT or np.ptp(z) == 0:
        return None
    total = float(((z - z.mean()) ** 2).sum())
    best_k, best_sse = None, math.inf
    for k in range(MIN_SEGMENT, n - MIN_SEGMENT + 1):
        a, b = z[:k], z[k:]
        sse = float(((a - a.mean()) ** 2).sum() + ((b - b.mean()) ** 2).sum())
        if sse < best_sse - 1e-12 * total:  # the first of equal splits
            best_k, best_sse = k, sse
    before, after = float(z[:best_k].mean()), float(z[best_k:].mean())
    return {"index": int(where[best_k]), "before": before, "after": after, "shift": after - before,
            "explained": 1.0 - best_sse / total, "method": "single change point, least squares (binary segmentation, L2)"}

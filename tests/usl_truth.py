"""An independent least-squares fit of the USL, numpy alone, for tests that need the fit's expected
values without asking kneeswarm.analysis.models.usl (which uses scipy's curve_fit).

    X(N) = λ·N / (1 + σ·(N − 1) + κ·N·(N − 1))

For fixed (σ, κ) the X are linear in λ, so the best λ is closed form (Σ X·g / Σ g², g = X/λ);
(σ, κ) come from a grid over [0, 1]² (κ on a square-root scale) that zooms in on its best cell.
tests/test_usl.py checks it recovers exact USL curves.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

GRID = 81  # points per axis of each grid
KEEP = 8  # cells kept on each side of the best one: a valley along σ-κ must stay inside the zoom
ROUNDS = 60  # zooms: each keeps 2·KEEP of the GRID - 1 cells per axis (the box shrinks 5x a round)


def usl_lstsq(users: Sequence[float], qps: Sequence[float]) -> dict[str, float | None]:
    """{sigma, kappa, lambda, n_star} minimising Σ (X − X̂)² with σ, κ in [0, 1]."""
    n = np.asarray(users, dtype=float)
    x = np.asarray(qps, dtype=float)
    lo, hi = np.array([0.0, 0.0]), np.array([1.0, 1.0])  # σ and √κ
    best = (0.0, 0.0, 0.0)
    for _ in range(ROUNDS):
        s, r = np.meshgrid(np.linspace(lo[0], hi[0], GRID), np.linspace(lo[1], hi[1], GRID), indexing="ij")
        g = n / (1.0 + s[..., None] * (n - 1.0) + (r ** 2)[..., None] * n * (n - 1.0))
        lam = (g * x).sum(-1) / (g * g).sum(-1)
        sse = ((x - lam[..., None] * g) ** 2).sum(-1)
        i, j = np.unravel_index(int(np.argmin(sse)), sse.shape)
        best = (float(s[i, j]), float(r[i, j] ** 2), float(lam[i, j]))
        step = (hi - lo) / (GRID - 1)
        lo = np.maximum([s[i, j] - KEEP * step[0], r[i, j] - KEEP * step[1]], 0.0)
        hi = np.minimum([s[i, j] + KEEP * step[0], r[i, j] + KEEP * step[1]], 1.0)
    sigma, kappa, lam = best
    n_star = math.sqrt((1.0 - sigma) / kappa) if kappa > 0 else None
    return {"sigma": sigma, "kappa": kappa, "lambda": lam, "n_star": n_star}

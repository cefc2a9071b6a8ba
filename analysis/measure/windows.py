"""Step windows, and means of samples over them: the time frame every per-step figure shares.

The steady window of a step is ``[t_steady + settle, t_end)``: the ramp and the first
``settle`` seconds after all users were running are left out; under ``hold = "auto"`` the window
starts at the step's ``t_cut`` instead when that is later (its warm-up, cut on the master by
MSER-5: locustfiles/steady.py).  A step whose ``t_end`` is
missing (the run died during it) ends where the next step's ramp began, or, for the last
step, at the completion of the last request.

A soak (``[load] mode = "soak"``) records one step per window of one unchanged load: only its
first window ramped, so only that one leaves ``settle`` out (``step_settles``); the later windows
tile the run from end to end.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pandas as pd

from kneeswarm.contracts.plan import is_soak
from kneeswarm.contracts.rundir import STEP_COLUMNS

logger = logging.getLogger(__name__)


def good_latency(requests: pd.DataFrame) -> np.ndarray:
    """True where ``latency_ms`` is a finite number >= 0."""
    lat = pd.to_numeric(requests["latency_ms"], errors="coerce").to_numpy(dtype=float)
    with np.errstate(invalid="ignore"):
        return np.isfinite(lat) & (lat >= 0)


def completion_times(requests: pd.DataFrame) -> np.ndarray:
    """Epoch seconds at which each request ended (t_start + latency; t_start without a usable latency)."""
    t = requests["t_start"].to_numpy(dtype=float)
    if "latency_ms" not in requests.columns:
        return t
    lat = requests["latency_ms"].to_numpy(dtype=float)
    return t + np.where(good_latency(requests), lat, 0.0) / 1000.0


def step_settles(load: dict, n_steps: int, settle: float) -> float | np.ndarray:
    """The seconds each step leaves out after its ramp: ``settle`` for every step, or in a soak
    (``load``: the plan's [load] table) for its first window only."""
    if not is_soak(load if isinstance(load, dict) else {}):
        return float(settle)
    return np.where(np.arange(n_steps) == 0, float(settle), 0.0)


def resolve_windows(steps: pd.DataFrame, last_done: pd.DataFrame | float, settle: float | np.ndarray) -> pd.DataFrame:
    """steps + ``t_end_used`` (t_end, else next t_ramp, else the last completion), ``t_lo``, ``t_hi``,
    ``window_s``.  ``last_done``: the last completion (epoch s, NaN if none), or the request rows."""
    out = steps.copy().reset_index(drop=True)
    for col in STEP_COLUMNS:
        if col not in out.columns:
            out[col] = np.nan
        out[col] = pd.to_numeric(out[col], errors="coerce")
    if out["index"].isna().all():
        out["index"] = np.arange(len(out))
    t_end = out["t_end"].to_numpy(dtype=float).copy()
    next_ramp = np.append(out["t_ramp"].to_numpy(dtype=float)[1:], np.nan)
    if isinstance(last_done, pd.DataFrame):
        last_done = float(np.nanmax(completion_times(last_done))) if len(last_done) else np.nan
    fill = np.where(np.isfinite(next_ramp), next_ramp, last_done)
    missing = ~np.isfinite(t_end)
    t_end[missing] = fill[missing]
    out["t_end_used"] = t_end
    t_lo = out["t_steady"].to_numpy(dtype=float) + np.asarray(settle, dtype=float)  # one, or one per step
    if "t_cut" in out.columns:  # hold = "auto": the master cut the step's warm-up (MSER-5) here
        cut = pd.to_numeric(out["t_cut"], errors="coerce").to_numpy(dtype=float)
        t_lo = np.where(np.isfinite(cut) & (cut > t_lo), cut, t_lo)
    out["t_lo"] = t_lo
    out["t_hi"] = t_end
    out["window_s"] = out["t_hi"] - out["t_lo"]
    return out


def window_means(df: pd.DataFrame | None, columns: dict[str, str], t_lo: np.ndarray, t_hi: np.ndarray,
                 by: str | None = None, sum_cols: tuple[str, ...] = (), peak: bool = False) -> list[dict[str, float]]:
    """Mean of each present column over each window [t_lo, t_hi); one dict {columns[c]: mean} per window.

    With ``by`` (e.g. several pids or GPUs per sample), samples at the same ``t`` are first
    combined: summed for ``sum_cols``, averaged otherwise.  ``peak``: the largest sample instead
    of the mean.
    """
    n = len(t_lo)
    if df is None or df.empty:
        return [{} for _ in range(n)]
    cols = [c for c in columns if c in df.columns]
    if not cols:
        return [{} for _ in range(n)]
    data = df[["t", *cols]].copy()
    for c in cols:
        data[c] = pd.to_numeric(data[c], errors="coerce")
    if by is not None and by in df.columns and df.duplicated("t").any():
        agg = {c: ("sum" if c in sum_cols else "mean") for c in cols}
        data = data.groupby("t", sort=True).agg(agg).reset_index()
    t = data["t"].to_numpy(dtype=float)
    order = np.argsort(t, kind="stable")
    t = t[order]
    values = data[cols].to_numpy(dtype=float)[order]
    a = np.searchsorted(t, t_lo, side="left")
    b = np.searchsorted(t, t_hi, side="left")
    out: list[dict[str, float]] = []
    for lo, hi in zip(a, b):
        if hi <= lo:
            out.append({})
            continue
        # an all-NaN column gives NaN (dropped below); numpy's "Mean of empty slice" is expected
        with np.errstate(all="ignore"), warnings.catch_warnings(action="ignore", category=RuntimeWarning):
            means = (np.nanmax if peak else np.nanmean)(values[lo:hi], axis=0)
        out.append({columns[c]: float(m) for c, m in zip(cols, means) if np.isfinite(m)})
    return out

"""Per-step statistics over each step's steady window, computed from the request rows.

The steady window of a step is ``[t_steady + settle, t_end)``: the ramp and the first
``settle`` seconds after all users were running are left out.  A step whose ``t_end`` is
missing (the run died during it) ends where the next step's ramp began, or, for the last
step, at the completion of the last request.

Definitions (one row per step, from the rows whose ``t_start`` lies in the window):

* ``requests``  every row in the window; ``ok`` the successful ones: ``ok`` true and a latency
  that is a finite number >= 0 (a row marked ok without one is counted as an error of category
  ``bad_latency``, so that QPS and the percentiles count the same rows);
* ``qps``       successful requests per second of window (the article's throughput:
  successful inferences); ``rps`` all requests per second;
* ``mean_ms``, ``p50_ms`` … ``p999_ms``  over the successful rows' ``latency_ms``,
  ``numpy.percentile`` with its default (linear) method, never Locust's buckets;
* ``error_rate`` = failed rows / requests; ``errors`` = {category: count} (null -> "other").

Validity (``validate_steps``): a step is not trusted when its window is empty, it has fewer
than ``min_requests`` requests, more than ``MAX_ERROR_RATE`` of them failed or none succeeded,
a load-generator worker averaged more than ``generator_cpu_max`` % CPU during it, or data it
depends on was lost (``data_loss_reasons``: an unreadable request part, a generator CSV that
could not be read or has no sample in the window of a worker that sent requests in it).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import pandas as pd

from analysis.target import PROMETHEUS_STREAM, target_windows
from kneeswarm.rundir import UnreadablePart, safe_name

logger = logging.getLogger(__name__)

PERCENTILES = {"p50_ms": 50.0, "p95_ms": 95.0, "p99_ms": 99.0, "p999_ms": 99.9}
OTHER_ERROR = "other"
BAD_LATENCY_ERROR = "bad_latency"  # a row marked ok whose latency is not a finite number >= 0
MAX_ERROR_RATE = 0.5  # a step where more than this share of the requests failed is not valid

# server metrics averaged per step: stream -> {csv column: summary key}
VMSTAT_METRICS = {"us": "us", "sy": "sy", "wa": "wa", "cs": "cs", "r": "r"}
PROCESS_METRICS = {
    "cpu_pct": "cpu_pct",
    "usr_pct": "usr_pct",
    "sys_pct": "sys_pct",
    "rss_mb": "rss_mb",
    "threads": "threads",
    "cswch_s": "cswch_s",
    "nvcswch_s": "nvcswch_s",
    "migrations_s": "migrations_s",
}
GPU_MEAN_METRICS = {"sm_pct": "sm_pct", "mem_pct": "mem_pct"}  # mean over GPUs at each sample
GPU_SUM_METRICS = {"fb_used_mb": "fb_used_mb", "power_w": "power_w"}  # summed over GPUs
ACTIVE_THREAD_CPU_PCT = 5.0  # a thread using at least this %CPU in a sample counts as active


def ok_mask(requests: pd.DataFrame) -> np.ndarray:
    """True where the row is a success: ``ok`` true (null counts as false) and a latency that is
    a finite number >= 0."""
    if "ok" not in requests.columns or "latency_ms" not in requests.columns:
        return np.zeros(len(requests), dtype=bool)
    ok = np.asarray(requests["ok"].to_numpy() == True, dtype=bool)  # noqa: E712 (object dtype with None)
    return ok & _good_latency(requests)


def _good_latency(requests: pd.DataFrame) -> np.ndarray:
    lat = pd.to_numeric(requests["latency_ms"], errors="coerce").to_numpy(dtype=float)
    with np.errstate(invalid="ignore"):
        return np.isfinite(lat) & (lat >= 0)


def error_categories(requests: pd.DataFrame) -> pd.Series:
    """Each row's error category: the recorded one, ``bad_latency`` for a row marked ok without a
    usable latency, ``other`` for a failure without a category (None for successes)."""
    err = requests["error"] if "error" in requests.columns else pd.Series([None] * len(requests), dtype=object)
    out = err.astype(object).where(err.notna(), None).reset_index(drop=True)
    marked_ok = np.asarray(requests["ok"].to_numpy() == True, dtype=bool) if "ok" in requests.columns \
        else np.zeros(len(requests), dtype=bool)  # noqa: E712
    success = ok_mask(requests)
    out[~success] = out[~success].fillna(OTHER_ERROR)
    out[marked_ok & ~success] = BAD_LATENCY_ERROR
    out[success] = None
    return out


def completion_times(requests: pd.DataFrame) -> np.ndarray:
    """Epoch seconds at which each request ended (t_start + latency; t_start without a usable latency)."""
    t = requests["t_start"].to_numpy(dtype=float)
    if "latency_ms" not in requests.columns:
        return t
    lat = requests["latency_ms"].to_numpy(dtype=float)
    return t + np.where(_good_latency(requests), lat, 0.0) / 1000.0


def resolve_windows(steps: pd.DataFrame, requests: pd.DataFrame, settle: float) -> pd.DataFrame:
    """steps + ``t_end_used`` (t_end, else next t_ramp, else the last completion), ``t_lo``, ``t_hi``."""
    out = steps.copy().reset_index(drop=True)
    for col in ("index", "users", "t_ramp", "t_steady", "t_end"):
        if col not in out.columns:
            out[col] = np.nan
        out[col] = pd.to_numeric(out[col], errors="coerce")
    if out["index"].isna().all():
        out["index"] = np.arange(len(out))
    t_end = out["t_end"].to_numpy(dtype=float).copy()
    next_ramp = np.append(out["t_ramp"].to_numpy(dtype=float)[1:], np.nan)
    last_done = float(np.nanmax(completion_times(requests))) if len(requests) else np.nan
    fill = np.where(np.isfinite(next_ramp), next_ramp, last_done)
    missing = ~np.isfinite(t_end)
    t_end[missing] = fill[missing]
    out["t_end_used"] = t_end
    out["t_lo"] = out["t_steady"].to_numpy(dtype=float) + float(settle)
    out["t_hi"] = t_end
    out["window_s"] = out["t_hi"] - out["t_lo"]
    return out


def _empty_stats() -> dict[str, Any]:
    return dict(requests=0, ok=0, qps=np.nan, rps=np.nan, mean_ms=np.nan,
                **{k: np.nan for k in PERCENTILES}, error_rate=np.nan, errors={})


def step_stats(requests: pd.DataFrame, steps: pd.DataFrame, settle: float) -> pd.DataFrame:
    """One row per step: window, requests, qps, rps, mean/p50/p95/p99/p999 ms, error_rate, errors."""
    win = resolve_windows(steps, requests, settle)
    if len(requests) and not requests["t_start"].is_monotonic_increasing:
        requests = requests.sort_values("t_start", kind="stable").reset_index(drop=True)
    t = requests["t_start"].to_numpy(dtype=float) if len(requests) else np.empty(0)
    ok = ok_mask(requests)
    lat = requests["latency_ms"].to_numpy(dtype=float) if len(requests) else np.empty(0)
    err = error_categories(requests)

    lo_idx = np.searchsorted(t, win["t_lo"].to_numpy(dtype=float), side="left")
    hi_idx = np.searchsorted(t, win["t_hi"].to_numpy(dtype=float), side="left")
    rows = []
    for i, (a, b, w) in enumerate(zip(lo_idx, hi_idx, win["window_s"].to_numpy(dtype=float))):
        if not (np.isfinite(w) and w > 0) or b <= a:
            rows.append(_empty_stats())
            continue
        okw = ok[a:b]
        lat_ok = lat[a:b][okw]
        n, n_ok = int(b - a), int(okw.sum())
        stats = dict(requests=n, ok=n_ok, qps=n_ok / w, rps=n / w)
        if lat_ok.size:
            pct = np.percentile(lat_ok, list(PERCENTILES.values()))
            stats |= dict(mean_ms=float(lat_ok.mean()), **{k: float(v) for k, v in zip(PERCENTILES, pct)})
        else:
            stats |= dict(mean_ms=np.nan, **{k: np.nan for k in PERCENTILES})
        failed = err.iloc[a:b][~okw].astype(str)
        stats["errors"] = {str(k): int(v) for k, v in failed.value_counts().sort_index().items()}
        stats["error_rate"] = (n - n_ok) / n
        rows.append(stats)
    stats_df = pd.DataFrame(rows, index=win.index, columns=list(_empty_stats()))
    return pd.concat([win, stats_df], axis=1)


def window_means(df: pd.DataFrame | None, columns: dict[str, str], t_lo: np.ndarray, t_hi: np.ndarray,
                 by: str | None = None, sum_cols: tuple[str, ...] = ()) -> list[dict[str, float]]:
    """Mean of each present column over each window [t_lo, t_hi); one dict per window.

    With ``by`` (e.g. several pids or GPUs per sample), samples at the same ``t`` are first
    combined: summed for ``sum_cols``, averaged otherwise.
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
    out = []
    for lo, hi in zip(a, b):
        if hi <= lo:
            out.append({})
            continue
        with np.errstate(all="ignore"), _quiet():
            means = np.nanmean(values[lo:hi], axis=0)
        out.append({columns[c]: float(m) for c, m in zip(cols, means) if np.isfinite(m)})
    return out


class _quiet:
    """Silence numpy's 'Mean of empty slice' warning for all-NaN columns."""

    def __enter__(self):
        import warnings

        self._cm = warnings.catch_warnings()
        self._cm.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


def generator_cpu(generator: dict[str, pd.DataFrame], t_lo: np.ndarray, t_hi: np.ndarray) -> list[dict[str, float]]:
    """Per window: {worker: mean cpu_pct} over the workers that reported in that window."""
    per_worker = {w: window_means(df, {"cpu_pct": "cpu_pct"}, t_lo, t_hi) for w, df in generator.items()}
    return [{w: m[i]["cpu_pct"] for w, m in per_worker.items() if "cpu_pct" in m[i]} for i in range(len(t_lo))]


def thread_metrics(threads: pd.DataFrame | None, t_lo: np.ndarray, t_hi: np.ndarray) -> list[dict[str, float]]:
    """Per window, from per-thread samples (threads.csv: t, tid, cpu_pct, ...):

    * ``active_threads``: mean over samples of the number of threads at >= ACTIVE_THREAD_CPU_PCT %CPU
      (the article's "active threads");
    * ``top_thread_cpu_pct``: mean over samples of the busiest thread's %CPU (one thread pinned
      near 100 % while the others idle points at a serial section: a GIL, a lock, one stream).
    """
    if threads is None or threads.empty or "cpu_pct" not in threads.columns:
        return [{} for _ in range(len(t_lo))]
    cpu = pd.to_numeric(threads["cpu_pct"], errors="coerce")
    per_t = pd.DataFrame({"t": threads["t"].to_numpy(dtype=float), "cpu": cpu,
                          "active": (cpu >= ACTIVE_THREAD_CPU_PCT).astype(float)})
    agg = per_t.groupby("t", sort=True).agg(active_threads=("active", "sum"),
                                            top_thread_cpu_pct=("cpu", "max")).reset_index()
    return window_means(agg, {"active_threads": "active_threads", "top_thread_cpu_pct": "top_thread_cpu_pct"},
                        t_lo, t_hi)


def sy_share(process: dict[str, float]) -> float | None:
    """The kernel's share of the process's CPU time: sys / (usr + sys) over the window's means.

    The article: %sy above 10 % in a multi-threaded inference service means lock contention
    or context switching is out of control.  None when the process used no CPU.
    """
    usr, sys = process.get("usr_pct"), process.get("sys_pct")
    if usr is None or sys is None or not (usr + sys) > 0:
        return None
    return sys / (usr + sys)


def server_metrics(hosts: dict[str, dict[str, pd.DataFrame]], t_lo: np.ndarray, t_hi: np.ndarray) -> list[dict[str, Any]]:
    """Per window: {host: {metric: mean, ..., "target": {key: value}}} from vmstat, process,
    threads, gpu and prometheus (analysis.target) samples."""
    out: list[dict[str, Any]] = [{} for _ in range(len(t_lo))]
    for host, streams in hosts.items():
        process = window_means(streams.get("process"), PROCESS_METRICS, t_lo, t_hi, by="pid",
                               sum_cols=tuple(PROCESS_METRICS))
        parts = [
            window_means(streams.get("vmstat"), VMSTAT_METRICS, t_lo, t_hi),
            process,
            [{"sy_share": v} if (v := sy_share(p)) is not None else {} for p in process],
            thread_metrics(streams.get("threads"), t_lo, t_hi),
            window_means(streams.get("gpu"), GPU_MEAN_METRICS | GPU_SUM_METRICS, t_lo, t_hi, by="gpu",
                         sum_cols=tuple(GPU_SUM_METRICS)),
        ]
        target = target_windows(streams.get(PROMETHEUS_STREAM), t_lo, t_hi)
        for i in range(len(t_lo)):
            merged: dict[str, Any] = {k: v for p in parts for k, v in p[i].items()}
            if target[i]:
                merged["target"] = target[i]
            if merged:
                out[i][host] = merged
    return out


def _window_reasons(row: pd.Series, min_requests: int) -> list[str]:
    """Why a step's steady window cannot be trusted: no window, too few requests, too many failures."""
    w = row["window_s"]
    if not np.isfinite(float(row["t_steady"])):
        return ["the step never reached steady state (no t_steady)"]
    if not (math.isfinite(w) and w > 0):
        return [f"the steady window is empty ({_fmt_s(w)} after the {_fmt_s(row['t_lo'] - row['t_steady'])} settle)"]
    n, n_ok = int(row["requests"]), int(row["ok"])
    if n < min_requests:
        return [f"only {n} requests in the steady window (< {min_requests}): P99 not trustworthy"]
    if n and (n - n_ok) / n > MAX_ERROR_RATE:
        return [f"{n - n_ok} of {n} requests failed (more than {MAX_ERROR_RATE:.0%}): "
                "the figures describe failures, not the service"]
    if n_ok == 0:
        return ["no successful request in the steady window"]
    return []


def _generator_reason(cpu: dict[str, float], generator_cpu_max: float) -> list[str]:
    if not cpu:
        return []
    worker, top = max(cpu.items(), key=lambda kv: kv[1])
    if top <= generator_cpu_max:
        return []
    return [f"load generator CPU {top:.0f}% > {generator_cpu_max:.0f}% (worker {worker}): "
            "the generator, not the server, may be the bottleneck"]


def validate_steps(stats: pd.DataFrame, min_requests: int, gen_cpu: list[dict[str, float]] | None = None,
                   generator_cpu_max: float = 90.0, lost: list[list[str]] | None = None) -> pd.DataFrame:
    """Add ``valid`` (bool) and ``reasons`` (list of one-line strings) to the step statistics.

    ``lost``: per step, reasons from data that could not be read (:func:`data_loss_reasons`).
    """
    out = stats.copy()
    gen_cpu = gen_cpu or [{} for _ in range(len(out))]
    lost = lost or [[] for _ in range(len(out))]
    reasons = [_window_reasons(row, min_requests) + _generator_reason(cpu, generator_cpu_max) + list(why)
               for (_, row), cpu, why in zip(out.iterrows(), gen_cpu, lost)]  # one iteration per step
    out["valid"] = np.asarray([not why for why in reasons], dtype=bool)
    out["reasons"] = reasons
    out["generator_cpu_max"] = [max(c.values()) if c else np.nan for c in gen_cpu]
    return out


def workers_per_window(requests: pd.DataFrame, t_lo: np.ndarray, t_hi: np.ndarray) -> list[set[str]]:
    """Per window: the generator-CSV names (safe_name of ``worker``) that sent requests in it."""
    if not len(requests) or "worker" not in requests.columns:
        return [set() for _ in range(len(t_lo))]
    t = requests["t_start"].to_numpy(dtype=float)
    order = np.argsort(t, kind="stable")
    t, workers = t[order], requests["worker"].to_numpy()[order]
    a = np.searchsorted(t, t_lo, side="left")
    b = np.searchsorted(t, t_hi, side="left")
    return [{safe_name(str(w)) for w in pd.unique(workers[lo:hi]) if w is not None} for lo, hi in zip(a, b)]


def _part_hits(part: UnreadablePart, stats: pd.DataFrame) -> np.ndarray:
    """Which steps an unreadable part may have held rows of (all when its range is unknown)."""
    if part.step_range is not None:
        idx = stats["index"].to_numpy(dtype=float)
        return (idx >= part.step_range[0]) & (idx <= part.step_range[1])
    if part.t_range is not None:
        lo, hi = stats["t_lo"].to_numpy(dtype=float), stats["t_hi"].to_numpy(dtype=float)
        return ~((hi <= part.t_range[0]) | (lo > part.t_range[1]))
    return np.ones(len(stats), dtype=bool)


def data_loss_reasons(stats: pd.DataFrame, requests: pd.DataFrame, unreadable_parts: list[UnreadablePart],
                      generator: dict[str, pd.DataFrame], generator_unreadable: dict[str, str],
                      gen_cpu: list[dict[str, float]]) -> list[list[str]]:
    """Per step: why data the step depends on is missing (it cannot claim to be clean)."""
    out: list[list[str]] = [[] for _ in range(len(stats))]
    for part in unreadable_parts:
        for i in np.flatnonzero(_part_hits(part, stats)):
            where = "" if part.step_range or part.t_range else ", time range unknown"
            out[i].append(f"request rows lost: requests/{part.path.name} is unreadable{where}")
    for worker in sorted(generator_unreadable):
        for reasons in out:
            reasons.append(f"generator metrics unreadable (generator/{worker}.csv): "
                           "the load generator's CPU is unknown")
    senders = workers_per_window(requests, stats["t_lo"].to_numpy(dtype=float), stats["t_hi"].to_numpy(dtype=float))
    for i, (sent, cpu) in enumerate(zip(senders, gen_cpu)):
        for worker in sorted((sent & set(generator)) - set(cpu)):
            out[i].append(f"generator metrics missing: worker {worker} sent requests but has no sample "
                          "in the steady window")
    return out


def _fmt_s(x: float) -> str:
    return f"{x:.1f}s" if isinstance(x, (int, float)) and math.isfinite(x) else "unknown"

"""Per-step load statistics, from the request rows, and whether each step can be trusted.

A step's rows are those the recorder stamped with its index (the ``step`` column) whose
``t_start`` lies in the step's steady window (kneeswarm.analysis.measure.windows); a run recorded without the
column falls back to the window alone.  Rows in the window stamped with another step are
counted in ``foreign_rows`` (and said in the summary's warnings).

Definitions (one row per step):

* ``requests``  every row in the window; ``ok`` the successful ones: ``ok`` true and a latency
  that is a finite number >= 0 (a row marked ok without one is counted as an error of category
  ``bad_latency``, so that QPS and the percentiles count the same rows);
* ``qps``       successful requests per second of window (the article's throughput:
  successful inferences); ``rps`` all requests per second;
* ``mean_ms``, ``p50_ms`` … ``p999_ms``  over the successful rows' ``latency_ms``,
  ``numpy.percentile`` with its default (linear) method, never Locust's buckets;
* ``error_rate`` = failed rows / requests; ``errors`` = {category: count} (null -> "other");
* ``generator_cpu``: per step, each load-generator worker's mean %CPU over the window.

Validity (``validate_steps``): a step is not trusted when its window is empty, it has fewer
than ``min_requests`` requests, more than ``MAX_ERROR_RATE`` of them failed or none succeeded,
a load-generator worker averaged more than ``generator_cpu_max`` % CPU during it, or data it
depends on was lost (``data_loss_reasons``: an unreadable request part, a generator CSV that
could not be read or has no sample in the window of a worker that sent requests in it).
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pandas as pd

from kneeswarm.analysis.measure.requestscan import BAD_LATENCY_ERROR, OTHER_ERROR, PERCENTILES, scan_frame
from kneeswarm.analysis.measure.windows import completion_times, good_latency, window_means
from kneeswarm.contracts.rundir import UnreadablePart

logger = logging.getLogger(__name__)

MAX_ERROR_RATE = 0.5  # a step where more than this share of the requests failed is not valid
# a worker that sent requests in a step has a generator sample (one a second) within this many
# seconds of its steady window, or its CPU during the step is unknown
GENERATOR_SLACK_S = 2.0

__all__ = ["completion_times", "ok_mask", "error_categories", "step_stats", "generator_cpu", "validate_steps",
           "data_loss_reasons", "PERCENTILES", "OTHER_ERROR", "BAD_LATENCY_ERROR"]


def marked_ok(requests: pd.DataFrame) -> np.ndarray:
    """The recorder's ``ok`` as booleans (null counts as false)."""
    if "ok" not in requests.columns:
        return np.zeros(len(requests), dtype=bool)
    return np.asarray(requests["ok"].to_numpy() == True, dtype=bool)  # noqa: E712 (object dtype with None)


def ok_mask(requests: pd.DataFrame) -> np.ndarray:
    """True where the row is a success: marked ``ok`` and a latency that is a finite number >= 0."""
    if "latency_ms" not in requests.columns:
        return np.zeros(len(requests), dtype=bool)
    return marked_ok(requests) & good_latency(requests)


def error_categories(requests: pd.DataFrame) -> pd.Series:
    """Each row's error category: the recorded one, ``bad_latency`` for a row marked ok without a
    usable latency, ``other`` for a failure without a category (None for successes)."""
    err = requests["error"] if "error" in requests.columns else pd.Series([None] * len(requests), dtype=object)
    out = err.astype(object).where(err.notna(), None).reset_index(drop=True)
    success = ok_mask(requests)
    out[~success] = out[~success].fillna(OTHER_ERROR)
    out[marked_ok(requests) & ~success] = BAD_LATENCY_ERROR
    out[success] = None
    return out


def step_stats(requests: pd.DataFrame, steps: pd.DataFrame, settle: float) -> pd.DataFrame:
    """One row per step: window, requests, qps, rps, mean/p50/p95/p99/p999 ms, error_rate, errors,
    foreign_rows (rows in the window stamped with another step, left out), from rows in memory.
    A run directory is read part by part instead (kneeswarm.analysis.measure.requestscan.scan_parts)."""
    return scan_frame(requests, steps, settle).stats


def generator_cpu(generator: dict[str, pd.DataFrame], t_lo: np.ndarray, t_hi: np.ndarray) -> list[dict[str, float]]:
    """Per window: {worker: mean cpu_pct} over the workers that reported in that window."""
    per_worker = {w: window_means(df, {"cpu_pct": "cpu_pct"}, t_lo, t_hi) for w, df in generator.items()}
    return [{w: m[i]["cpu_pct"] for w, m in per_worker.items() if "cpu_pct" in m[i]} for i in range(len(t_lo))]


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


def _part_hits(part: UnreadablePart, stats: pd.DataFrame) -> np.ndarray:
    """Which steps an unreadable part may have held rows of (all when its range is unknown)."""
    if part.step_range is not None:
        idx = stats["index"].to_numpy(dtype=float)
        return (idx >= part.step_range[0]) & (idx <= part.step_range[1])
    if part.t_range is not None:
        lo, hi = stats["t_lo"].to_numpy(dtype=float), stats["t_hi"].to_numpy(dtype=float)
        return ~((hi <= part.t_range[0]) | (lo > part.t_range[1]))
    return np.ones(len(stats), dtype=bool)


def data_loss_reasons(stats: pd.DataFrame, workers: list[set[str]], unreadable_parts: list[UnreadablePart],
                      generator: dict[str, pd.DataFrame], generator_unreadable: dict[str, str]) -> list[list[str]]:
    """Per step: why data the step depends on is missing (it cannot claim to be clean).
    ``workers``: per step, the generator-CSV names of the workers that sent rows in its window."""
    out: list[list[str]] = [[] for _ in range(len(stats))]
    for part in unreadable_parts:
        for i in np.flatnonzero(_part_hits(part, stats)).tolist():
            where = "" if part.step_range or part.t_range else ", time range unknown"
            out[i].append(f"request rows lost: requests/{part.path.name} is unreadable{where}")
    for worker in sorted(generator_unreadable):
        for reasons in out:
            reasons.append(f"generator metrics unreadable (generator/{worker}.csv): "
                           "the load generator's CPU is unknown")
    t_lo, t_hi = stats["t_lo"].to_numpy(dtype=float), stats["t_hi"].to_numpy(dtype=float)
    near = generator_cpu(generator, t_lo - GENERATOR_SLACK_S, t_hi + GENERATOR_SLACK_S)
    for i, (sent, cpu) in enumerate(zip(workers, near)):
        for worker in sorted((sent & set(generator)) - set(cpu)):
            out[i].append(f"generator metrics missing: worker {worker} sent requests but has no sample "
                          "in the steady window")
    return out


def _fmt_s(x: float) -> str:
    return f"{x:.1f}s" if isinstance(x, (int, float)) and math.isfinite(x) else "unknown"

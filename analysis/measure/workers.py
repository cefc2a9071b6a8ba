"""Per load-generator worker: what each one sent, and what it cost, per step (so a saturated or lost worker shows).

For every worker (the request rows' ``worker``; the generator CSV of the same name, see
rundir.safe_name) and every step's steady window [t_lo, t_hi) (kneeswarm.analysis.measure.windows):

* ``requests``  its rows in the window that the recorder stamped with the step (the same rule
  as the step's own statistics, kneeswarm.analysis.measure.requestscan), ``rps`` = requests / window seconds;
* ``cpu_pct``   the mean of its generator samples in the window, ``rss_mb`` their peak,
  ``users`` their mean (the users Locust ran on it).

Totals per worker: all its rows, its mean CPU and peak RSS over the run, and, when the master
lost it mid-run (meta.json ``workers_lost``, written by locustfiles/plugin.py), when.

A worker lost mid-run (killed, network gone) flags the steps it affected (``lost_worker_reasons``):
step k is affected when the worker was last heard from before the step's window ended and was
declared missing after the step's ramp began (a loss declared before the ramp leaves the step
to the others: Locust hands the step's users to the workers still there).

The rows are read part by part (three columns), so memory follows one part, not the run.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from typing import Any, cast

from kneeswarm.analysis.schema.summary import Summary, WorkerStep, WorkerTotals

import numpy as np
import pandas as pd
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kneeswarm.contracts.rundir import REQUEST_SCHEMA, Meta, RunDir, safe_name

logger = logging.getLogger(__name__)

READ_COLUMNS = ("t_start", "step", "worker")
NO_WORKER = "(none)"  # rows recorded without a worker name


def _window_edges(stats: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (stats["index"].to_numpy(dtype=float), stats["t_lo"].to_numpy(dtype=float),
            stats["t_hi"].to_numpy(dtype=float))


def count_rows(rd: RunDir, stats: pd.DataFrame) -> tuple[Counter, list[Counter]]:
    """(rows per worker over the run, per step: rows per worker in its steady window)."""
    index, t_lo, t_hi = _window_edges(stats)
    total: Counter = Counter()
    per_step: list[Counter] = [Counter() for _ in range(len(stats))]
    for path in rd.request_parts():
        try:
            table = pq.read_table(path, columns=list(READ_COLUMNS), schema=REQUEST_SCHEMA)
        except Exception as e:  # noqa: BLE001 - an unreadable part is already counted by the request scan
            logger.warning("%s: unreadable for the worker table (%s)", path.name, e)
            continue
        t = table.column("t_start").to_numpy(zero_copy_only=False).astype(float)
        step = np.asarray(table.column("step").to_pandas(), dtype=float)  # null -> NaN
        # dictionary-encoded in Arrow, as kneeswarm.analysis.measure.requestscan does: np.unique sorts the strings (an
        # object argsort per part: 33 of a 36M-row soak's 75 analysis seconds, bench/soak.py)
        enc = pc.dictionary_encode(table.column("worker").fill_null(NO_WORKER)).combine_chunks()
        names, codes = np.asarray(enc.dictionary.to_pylist(), dtype=object), enc.indices.to_numpy(zero_copy_only=False)
        total.update(dict(zip(names.tolist(), np.bincount(codes, minlength=len(names)).tolist())))
        _count_in_windows(t, step, codes, names, index, t_lo, t_hi, per_step)
    return total, per_step


def _count_in_windows(t: np.ndarray, step: np.ndarray, codes: np.ndarray, names: np.ndarray, index: np.ndarray,
                      t_lo: np.ndarray, t_hi: np.ndarray, per_step: list[Counter]) -> None:
    """Add to ``per_step`` each window's rows per worker: a row stamped with step k counts in step
    k's window only (one vectorised pass); a row without a stamp (an old run), in any window."""
    if not len(index) or not len(t):
        return
    usable = np.isfinite(t_lo) & (t_hi > t_lo)
    stamped = np.isfinite(step)
    pos = np.full(len(t), -1)
    pos[stamped] = _positions(step[stamped], index, usable)
    ok = pos >= 0
    ok[ok] = (t[ok] >= t_lo[pos[ok]]) & (t[ok] < t_hi[pos[ok]])
    n = np.bincount(pos[ok] * len(names) + codes[ok], minlength=len(index) * len(names)).reshape(len(index), -1)
    for i, j in zip(*np.nonzero(n)):
        per_step[i][names[j]] += int(n[i, j])
    for i in np.flatnonzero(usable) if (~stamped).any() else []:
        mine = ~stamped & (t >= t_lo[i]) & (t < t_hi[i])
        for j, k in enumerate(np.bincount(codes[mine], minlength=len(names))):
            if k:
                per_step[i][names[j]] += int(k)


def _positions(step: np.ndarray, index: np.ndarray, usable: np.ndarray) -> np.ndarray:
    """Position in ``index`` of each step value (-1 where none), vectorised."""
    order = np.argsort(index, kind="stable")
    at = np.clip(np.searchsorted(index[order], step), 0, len(index) - 1)
    pos = order[at]
    return np.where((index[pos] == step) & usable[pos], pos, -1)


def sample_stats(df: pd.DataFrame | None, lo: float, hi: float) -> dict[str, float]:
    """Mean cpu_pct, peak rss_mb and mean users of one worker's generator samples in [lo, hi)."""
    if df is None or df.empty or "t" not in df.columns:
        return {}
    t = pd.to_numeric(df["t"], errors="coerce").to_numpy(dtype=float)
    inside = (t >= lo) & (t < hi)
    out: dict[str, float] = {}
    for key, column, how in (("cpu_pct", "cpu_pct", np.nanmean), ("rss_mb", "rss_mb", np.nanmax),
                             ("users", "users", np.nanmean)):
        if column not in df.columns:
            continue
        v = pd.to_numeric(df[column], errors="coerce").to_numpy(dtype=float)[inside]
        v = v[np.isfinite(v)]
        if len(v):
            out[key] = float(how(v))
    return out


def lost_workers(meta: Meta) -> list[dict[str, Any]]:
    """meta.json's ``workers_lost`` entries that carry a worker and a time (untyped JSON: Meta's)."""
    out = []
    for e in meta.get("workers_lost") or []:
        if isinstance(e, dict) and e.get("worker") and isinstance(e.get("t"), (int, float)):
            out.append(e)
    return out


def worker_table(rd: RunDir, stats: pd.DataFrame, generator: dict[str, pd.DataFrame],
                 meta: Meta) -> tuple[dict[str, WorkerTotals], list[dict[str, WorkerStep]]]:
    """(per worker totals, per step {worker: {requests, rps, cpu_pct, rss_mb, users}})."""
    total, per_step = count_rows(rd, stats)
    gen = {safe_name(w): df for w, df in generator.items()}
    names = sorted(set(total) | {w for w in generator if w not in {safe_name(n) for n in total}})
    _, t_lo, t_hi = _window_edges(stats)
    window = t_hi - t_lo
    steps: list[dict[str, WorkerStep]] = []
    for i, counts in enumerate(per_step):
        row: dict[str, WorkerStep] = {}
        for w in names:
            cell: WorkerStep = {"requests": int(counts.get(w, 0))}
            ok_window = math.isfinite(window[i]) and window[i] > 0
            cell["rps"] = cell["requests"] / window[i] if ok_window else None
            cell.update(cast(WorkerStep, sample_stats(gen.get(safe_name(w)), t_lo[i], t_hi[i]) if ok_window else {}))
            row[w] = cell
        steps.append(row)
    lost = {e["worker"]: e for e in lost_workers(meta)}
    n = sum(total.values())
    totals: dict[str, WorkerTotals] = {}
    for w in names:
        overall = sample_stats(gen.get(safe_name(w)), -math.inf, math.inf)
        totals[w] = {"requests": int(total.get(w, 0)), "share": total.get(w, 0) / n if n else None,
                     "cpu_pct_mean": overall.get("cpu_pct"), "rss_mb_peak": overall.get("rss_mb"),
                     "lost": _lost_record(lost.get(w))}
    return totals, steps


def _lost_record(e: dict[str, Any] | None) -> dict[str, Any] | None:  # a workers_lost entry: untyped JSON
    if e is None:
        return None
    return {k: e.get(k) for k in ("t", "t_last_heard", "t_last_report", "step", "workers_before", "t_back") if k in e}


def clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(t)) + "Z"


def lost_worker_reasons(stats: pd.DataFrame, meta: Meta, t0: float | None) -> list[list[str]]:
    """Per step: one reason per worker lost while the step ran (see the module docstring)."""
    t_ramp = pd.to_numeric(stats.get("t_ramp", pd.Series(np.nan, index=stats.index)), errors="coerce")
    t_ramp = t_ramp.to_numpy(dtype=float)
    _, _, t_hi = _window_edges(stats)
    out: list[list[str]] = [[] for _ in range(len(stats))]
    for e in lost_workers(meta):
        seen = float(e.get("t_last_heard") or e["t"])
        gone = float(e["t"])
        before = e.get("workers_before")
        left = f"{before - 1} of {before}" if isinstance(before, int) and before > 0 else "fewer"
        since = f" (t+{seen - t0:.0f}s)" if t0 is not None and math.isfinite(t0) else ""
        text = (f"worker {e['worker']} lost at {clock(seen)}{since} (last heard from; declared missing at "
                f"{clock(gone)}): this step ran with {left} workers from then on")
        if isinstance(e.get("t_last_report"), (int, float)):  # a worker's rows ride on its reports
            text += f"; what it sent after its last report ({clock(e['t_last_report'])}) never reached the master"
        if isinstance(e.get("t_back"), (int, float)):
            text += f" (it answered again at {clock(e['t_back'])})"
        for i in range(len(stats)):
            starts_before = not math.isfinite(t_ramp[i]) or gone > t_ramp[i]
            if seen < t_hi[i] and starts_before:
                out[i].append(text)
    return out


# -- tables for summary.md and index.html ------------------------------------------------------
TOTAL_HEADER = ["worker", "requests", "share", "mean CPU %", "peak RSS MB", "lost"]
MIN_WORKERS_SHOWN = 2  # the tables are shown from this many workers (or when one was lost)
STEP_HEADER = ["users", "worker", "requests", "req/s", "mean CPU %", "peak RSS MB", "worker users"]


def _fmt(v: Any, fmt: str) -> str:
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return "–"
    return fmt.format(v)


def _lost_cell(lost: dict[str, Any] | None) -> str:  # a workers_lost entry as copied: untyped JSON
    if not lost or not isinstance(lost.get("t"), (int, float)):
        return ""
    step = f" in step {lost['step']}" if lost.get("step") is not None else ""
    heard = lost.get("t_last_heard")
    return f"lost at {clock(heard if isinstance(heard, (int, float)) else lost['t'])}{step}"


def worker_tables(summary: Summary) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of the per-worker tables: totals, then each step's workers; [] when
    there is only one worker and it was not lost (the timeline shows its CPU already)."""
    workers = summary.get("workers")
    if not isinstance(workers, dict) or not workers:
        return []
    if len(workers) < MIN_WORKERS_SHOWN and not any((t or {}).get("lost") for t in workers.values()):
        return []
    totals = [[w, _fmt(t.get("requests"), "{:,}"), _fmt(t.get("share"), "{:.1%}"), _fmt(t.get("cpu_pct_mean"), "{:.0f}"),
               _fmt(t.get("rss_mb_peak"), "{:,.0f}"), _lost_cell(t.get("lost"))] for w, t in workers.items()]
    per_step = []
    for s in summary.get("steps") or []:
        for w, c in (s.get("workers") or {}).items():
            per_step.append([str(s.get("users")), w, _fmt(c.get("requests"), "{:,}"), _fmt(c.get("rps"), "{:,.1f}"),
                             _fmt(c.get("cpu_pct"), "{:.0f}"), _fmt(c.get("rss_mb"), "{:,.0f}"),
                             _fmt(c.get("users"), "{:.3g}")])
    out = [("Load generator workers (whole run)", TOTAL_HEADER, totals)]
    if per_step:
        out.append(("Load generator workers per step (steady windows)", STEP_HEADER, per_step))
    return out

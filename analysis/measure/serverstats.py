"""Per-step server metrics: what each monitored host was doing during each step's steady window.

From the parsed host tables (collectors/): vmstat (host CPU, context switches, run queue),
process (the monitored service: its processes' sums -- the process found and its descendants, or its
cgroup's processes, agents/remote/tree.py -- summed again over the pids of a sample where a table
has one row per process, as pidstat's), tree (each of the service's processes: ``processes``, how
many at once, and ``procs`` {pid: its own cpu_pct, rss_mb, threads}), fds (its open file
descriptors), threads (active threads, the busiest thread of any of its processes), gpu (SM and memory %, averaged over GPUs; framebuffer and power, summed), cgroup (the
throttled share of CFS periods, the cgroup's CPU use) and the target's own /metrics
(kneeswarm.analysis.measure.target).  Each value is the mean of the samples whose ``t`` lies in the window
(kneeswarm.analysis.measure.windows); ``fb_peak_mb`` is their largest.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence, cast

import numpy as np
import pandas as pd

from kneeswarm.analysis.measure.target import PROMETHEUS_STREAM, target_windows
from kneeswarm.analysis.schema.summary import ServerMetrics
from kneeswarm.analysis.measure.windows import window_means

logger = logging.getLogger(__name__)

# server metrics averaged per step: stream -> {csv column: summary key}
# bi, bo: the host's disk traffic, KiB/s (blocks of 1 KiB): io_wait weighs the service's own IO against it
VMSTAT_METRICS = {"us": "us", "sy": "sy", "wa": "wa", "cs": "cs", "r": "r", "bi": "bi", "bo": "bo"}
PROCESS_METRICS = {
    "cpu_pct": "cpu_pct",
    "usr_pct": "usr_pct",
    "sys_pct": "sys_pct",
    "wait_pct": "wait_pct",  # the process's threads waiting for a CPU (run delay), % of one CPU
    "rss_mb": "rss_mb",
    "threads": "threads",
    "cswch_s": "cswch_s",
    "nvcswch_s": "nvcswch_s",
    "migrations_s": "migrations_s",
    "io_read_kb_s": "io_read_kb_s",  # the process's own disk IO (pidstat -d), KiB/s
    "io_write_kb_s": "io_write_kb_s",
    "io_delay_pct": "io_delay_pct",  # its threads blocked on disk IO, % of one CPU's time (delay accounting)
}
FD_METRICS = {"fds": "fds"}  # open file descriptors of the monitored process (collectors/fds.py)
GPU_MEAN_METRICS = {"sm_pct": "sm_pct", "mem_pct": "mem_pct"}  # mean over GPUs at each sample
GPU_SUM_METRICS = {"fb_used_mb": "fb_used_mb", "power_w": "power_w"}  # summed over GPUs
# the largest sample of the window, summed over GPUs: gpu_memory_creep reads the peak, as the
# method says to watch it ("the peak over long concurrent runs")
GPU_PEAK_METRICS = {"fb_used_mb": "fb_peak_mb"}
ACTIVE_THREAD_CPU_PCT = 5.0  # a thread using at least this %CPU in a sample counts as active


PER_SAMPLE_THREADS = ("active_threads", "top_thread_cpu_pct")  # active_threads' columns besides t


def thread_samples(threads: pd.DataFrame) -> pd.DataFrame:
    """Per sample time of a piece of threads.csv (t, cpu_pct): t, ``active_threads``, ``top_thread_cpu_pct``.

    Both are exact when summed / maxed again over pieces of one table (:func:`combine_thread_samples`):
    kneeswarm.analysis.measure.inputs reads threads.csv a chunk of rows at a time, a sample time's rows may straddle two."""
    cpu = pd.to_numeric(threads["cpu_pct"], errors="coerce")
    per_t = pd.DataFrame({"t": threads["t"].to_numpy(dtype=float), "cpu": cpu,
                          "active": (cpu >= ACTIVE_THREAD_CPU_PCT).astype(float)})
    return per_t.groupby("t", sort=True).agg(active_threads=("active", "sum"),
                                             top_thread_cpu_pct=("cpu", "max")).reset_index()


def combine_thread_samples(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """:func:`thread_samples` of several pieces of one table as one: per t, active threads summed, the top maxed."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame({"t": pd.Series(dtype=float), **{c: pd.Series(dtype=float) for c in PER_SAMPLE_THREADS}})
    if len(parts) == 1:
        return parts[0]
    return pd.concat(parts, ignore_index=True).groupby("t", sort=True).agg(
        active_threads=("active_threads", "sum"), top_thread_cpu_pct=("top_thread_cpu_pct", "max")).reset_index()


def active_threads(threads: pd.DataFrame | None) -> pd.DataFrame | None:
    """Per sample time of threads.csv: t, ``active_threads`` (threads at >= ACTIVE_THREAD_CPU_PCT
    %CPU) and ``top_thread_cpu_pct`` (the busiest thread's %CPU); None without thread samples.
    ``threads`` is the table itself, or already these per-sample figures (what kneeswarm.analysis.measure.inputs
    reads into ``hosts[host]["threads"]``: the table grows with threads x hours, they do not)."""
    if threads is None or threads.empty:
        return None
    if set(PER_SAMPLE_THREADS) <= set(threads.columns):
        return threads
    if "cpu_pct" not in threads.columns:
        return None
    return thread_samples(threads)


def thread_metrics(threads: pd.DataFrame | None, t_lo: np.ndarray, t_hi: np.ndarray) -> list[dict[str, float]]:
    """Per window, from per-thread samples (threads.csv: t, tid, cpu_pct, ...):

    * ``active_threads``: mean over samples of the number of threads at >= ACTIVE_THREAD_CPU_PCT %CPU
      (the article's "active threads");
    * ``top_thread_cpu_pct``: mean over samples of the busiest thread's %CPU (one thread pinned
      near 100 % while the others idle points at a serial section: a GIL, a lock, one stream).
    """
    per_sample = active_threads(threads)
    if per_sample is None:
        return [{} for _ in range(len(t_lo))]
    return window_means(per_sample, {"active_threads": "active_threads", "top_thread_cpu_pct": "top_thread_cpu_pct"},
                        t_lo, t_hi)


CGROUP_MEANS = {"usage_cpus": "cgroup_cpus"}


def _cumulative(cgroup: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray]:
    """(sample times, the column's per-interval increases summed up to each sample), by time."""
    t = cgroup["t"].to_numpy(dtype=float)
    d = pd.to_numeric(cgroup[column], errors="coerce").to_numpy(dtype=float)
    order = np.argsort(t, kind="stable")
    t, d = t[order], d[order]
    keep = np.isfinite(t)
    return t[keep], np.cumsum(np.where(np.isfinite(d[keep]), d[keep], 0.0))


def throttled_shares(cgroup: pd.DataFrame | None, t_lo: np.ndarray, t_hi: np.ndarray) -> list[float | None]:
    """Per window, throttled CFS periods / periods elapsed between its two ends: the cumulative
    counters (the summed per-interval increases of nr_throttled and nr_periods) interpolated at
    t_lo and t_hi, as one reads the kernel's cpu.stat before and after the window.  Where a window
    runs past the samples, the span they cover.  None without periods (no CPU quota)."""
    if cgroup is None or cgroup.empty or not {"periods", "throttled_periods"} <= set(cgroup.columns):
        return [None] * len(t_lo)
    t, periods = _cumulative(cgroup, "periods")
    _, throttled = _cumulative(cgroup, "throttled_periods")
    out: list[float | None] = []
    for lo, hi in zip(t_lo, t_hi):
        if len(t) < 2 or not (np.isfinite(lo) and np.isfinite(hi)) or t[-1] <= lo or t[0] >= hi:
            out.append(None)
            continue
        dp = np.interp(hi, t, periods) - np.interp(lo, t, periods)
        dt = np.interp(hi, t, throttled) - np.interp(lo, t, throttled)
        out.append(float(dt / dp) if dp > 0 else None)
    return out


def cgroup_metrics(cgroup: pd.DataFrame | None, t_lo: np.ndarray, t_hi: np.ndarray) -> list[dict[str, float]]:
    """Per window, from the cgroup table (collectors/cgroup.py): ``throttled_share``
    (``throttled_shares``) and ``cgroup_cpus``, the cgroup's CPU seconds per second (cpuacct.usage,
    cpu.stat usage_usec; the mean of its samples)."""
    out = window_means(cgroup, CGROUP_MEANS, t_lo, t_hi)
    for m, share in zip(out, throttled_shares(cgroup, t_lo, t_hi)):
        if share is not None:
            m["throttled_share"] = share
    return out


def sy_share(process: dict[str, float]) -> float | None:
    """The kernel's share of the process's CPU time: sys / (usr + sys) over the window's means.

    The article: %sy above 10 % in a multi-threaded inference service means lock contention
    or context switching is out of control.  None when the process used no CPU.
    """
    usr, sys = process.get("usr_pct"), process.get("sys_pct")
    if usr is None or sys is None or not (usr + sys) > 0:
        return None
    return sys / (usr + sys)


TREE_MEANS = ("cpu_pct", "rss_mb", "threads")  # each process's own figures kept per step (``procs``)


def tree_metrics(tree: pd.DataFrame | None, t_lo: np.ndarray, t_hi: np.ndarray) -> list[ServerMetrics]:
    """Per window, from the tree table (each process of the service per sample): ``processes``,
    the mean number of them per sample, and ``procs`` {pid: {cpu_pct, rss_mb, threads}}, the
    means of each one's own samples in the window (a worker that lived through part of it: over
    that part).  {} without a tree table (a run from before it)."""
    if tree is None or tree.empty or not {"t", "pid"} <= set(tree.columns):
        return [{} for _ in range(len(t_lo))]
    t = pd.to_numeric(tree["t"], errors="coerce").to_numpy(dtype=float)
    pid = pd.to_numeric(tree["pid"], errors="coerce").to_numpy(dtype=float)
    cols = [c for c in TREE_MEANS if c in tree.columns]
    values = {c: pd.to_numeric(tree[c], errors="coerce").to_numpy(dtype=float) for c in cols}
    out: list[ServerMetrics] = []
    for lo, hi in zip(t_lo, t_hi):
        inside = (t >= lo) & (t < hi) & np.isfinite(pid)
        if not inside.any():
            out.append({})
            continue
        part = pd.DataFrame({"t": t[inside], "pid": pid[inside].astype(np.int64),
                             **{c: v[inside] for c, v in values.items()}})
        means = part.groupby("pid", sort=True)[cols].mean()
        procs = {str(p): {c: float(v) for c, v in row.items() if np.isfinite(v)} for p, row in means.iterrows()}
        out.append({"processes": float(part.groupby("t")["pid"].nunique().mean()), "procs": procs})
    return out


def server_metrics(hosts: dict[str, dict[str, pd.DataFrame]], t_lo: np.ndarray, t_hi: np.ndarray) -> list[dict[str, ServerMetrics]]:
    """Per window: {host: {metric: mean, ..., "target": {key: value}}} from vmstat, process,
    threads, gpu and prometheus (kneeswarm.analysis.measure.target) samples."""
    out: list[dict[str, ServerMetrics]] = [{} for _ in range(len(t_lo))]
    for host, streams in hosts.items():
        process = window_means(streams.get("process"), PROCESS_METRICS, t_lo, t_hi, by="pid",
                               sum_cols=tuple(PROCESS_METRICS))
        parts: list[Sequence[Mapping[str, object]]] = [
            window_means(streams.get("vmstat"), VMSTAT_METRICS, t_lo, t_hi),
            process,
            [{"sy_share": v} if (v := sy_share(p)) is not None else {} for p in process],
            thread_metrics(streams.get("threads"), t_lo, t_hi),
            window_means(streams.get("fds"), FD_METRICS, t_lo, t_hi, by="pid", sum_cols=tuple(FD_METRICS)),
            window_means(streams.get("gpu"), GPU_MEAN_METRICS | GPU_SUM_METRICS, t_lo, t_hi, by="gpu",
                         sum_cols=tuple(GPU_SUM_METRICS)),
            window_means(streams.get("gpu"), GPU_PEAK_METRICS, t_lo, t_hi, by="gpu", sum_cols=tuple(GPU_PEAK_METRICS),
                         peak=True),
            cgroup_metrics(streams.get("cgroup"), t_lo, t_hi),
            tree_metrics(streams.get("tree"), t_lo, t_hi),
        ]
        target = target_windows(streams.get(PROMETHEUS_STREAM), t_lo, t_hi)
        for i in range(len(t_lo)):
            merged: ServerMetrics = {k: v for p in parts for k, v in p[i].items()}
            if target[i]:
                merged["target"] = target[i]
            if merged:
                out[i][host] = merged
    return out


def energy_per_request(server: dict[str, ServerMetrics], completed: Any, window_s: Any) -> float | None:
    """Joules per completed request over a step: the GPUs' mean power (``power_w``, summed over
    the hosts that recorded it) x the window / the completed requests (or, given the output tokens
    of the completed requests, per token); None without power or completions.  It is the
    cost figure capacity planners ask for."""
    power = [cast(float, p) for m in server.values() if isinstance(m, dict) and (p := m.get("power_w")) is not None]
    try:
        n, w = float(completed), float(window_s)
    except (TypeError, ValueError):
        return None
    if not power or not (n > 0 and np.isfinite(w) and w > 0):
        return None
    return float(sum(power)) * w / n

"""/proc sampler output (procfs.jsonl): the monitored process, read straight from /proc.

The sampler runs in the remote agent (stdlib only; used where pidstat is missing) and writes ONE
JSON OBJECT PER LINE, PER SAMPLE of the monitored process; all counters are CUMULATIVE (as the
kernel gives them), the parser differences consecutive samples of the same pid::

    {"t": 1796002084.01,   # epoch seconds (time.time()) when the sample was read
     "pid": 4041,          # the process (thread-group id)
     "utime": 1234,        # /proc/PID/stat field 14, clock ticks (all threads, live and dead)
     "stime": 56,          # /proc/PID/stat field 15, clock ticks
     "clk_tck": 100,       # os.sysconf("SC_CLK_TCK")
     "rss_kb": 11320,      # /proc/PID/status VmRSS
     "vsz_kb": 235736,     # /proc/PID/status VmSize
     "threads": 4,         # /proc/PID/status Threads
     "vol_cs": 5120,       # voluntary_ctxt_switches SUMMED over /proc/PID/task/*/status
     "invol_cs": 877,      # nonvoluntary_ctxt_switches, summed likewise
                           #   (/proc/PID/status alone holds the main thread's only)
     "minflt": 3088,       # /proc/PID/stat field 10
     "majflt": 0,          # /proc/PID/stat field 12
     "ncpu": 2,            # os.cpu_count()
     "wait_ns": 81234567,  # optional: run-queue wait, field 2 of /proc/PID/task/*/schedstat, summed
     "tasks": [[4043, "spin0", 800, 2, 1, 4000, 600], ...]}
                           # optional, one per thread: [tid, comm, utime ticks, stime ticks,
                           #   processor (/proc/PID/task/TID/stat field 39), voluntary cs,
                           #   nonvoluntary cs]

Numbers may be ints or floats. Missing optional keys give NaN columns. A counter that goes down
(pid reuse, a thread exiting from a summed counter) gives NaN for that interval, never a negative
rate.

Tables (one row per interval, stamped at its end, from the second sample of a pid on):

* ``process``: cpu_pct = (d utime + d stime) / clk_tck / dt * 100 (like pidstat's %CPU: can pass
  100 on several cores), usr_pct, sys_pct, wait_pct = d wait_ns / 1e9 / dt * 100, rss_mb, vsz_mb,
  threads, cswch_s, nvcswch_s, minflt_s, majflt_s per second, migrations_s = threads (from
  ``tasks``) whose processor changed since the previous sample / dt.
* ``threads``: from ``tasks``, for threads present in both samples.
"""
from __future__ import annotations

import logging
from datetime import tzinfo
from typing import Any, Iterable

from collectors.base import (NAN, PROCESS_COLUMNS, THREAD_COLUMNS, Collector, HostContext, Parsed,
                             Unavailable, finite, frame, json_records, to_float)

logger = logging.getLogger(__name__)

DEFAULT_CLK_TCK = 100.0
KB_PER_MB = 1024.0


def _rate(cur: float, prev: float, dt: float, scale: float = 1.0) -> float:
    d = cur - prev
    if d != d or d < 0:
        return NAN
    return d / scale / dt


def _tasks(v: object) -> dict[int, tuple[str, float, float, float, float, float]]:
    out: dict[int, tuple[str, float, float, float, float, float]] = {}
    if not isinstance(v, list):
        return out
    for task in v:
        if not isinstance(task, list) or len(task) < 7:
            continue
        tid = to_float(task[0])
        if not finite(tid):
            continue
        name = task[1] if isinstance(task[1], str) else str(task[1])
        out[int(tid)] = (name, *(to_float(x) for x in task[2:7]))  # type: ignore[misc]
    return out


def rows_from_samples(samples: Iterable[dict]) -> tuple[list[list], list[list], int]:
    """procfs-format sample dicts -> (process rows, thread rows, samples skipped)."""
    process_rows: list[list] = []
    thread_rows: list[list] = []
    skipped = 0
    prev: dict[int, dict] = {}
    for rec in samples:
        if not isinstance(rec, dict):
            skipped += 1
            continue
        t, pid_f = to_float(rec.get("t")), to_float(rec.get("pid"))
        if not (finite(t) and finite(pid_f)):
            skipped += 1
            continue
        pid = int(pid_f)
        cur = {k: to_float(rec.get(k)) for k in ("utime", "stime", "clk_tck", "rss_kb", "vsz_kb",
                                                   "threads", "vol_cs", "invol_cs", "minflt",
                                                   "majflt", "wait_ns")}
        cur["t"] = t
        cur["tasks"] = _tasks(rec.get("tasks"))
        p = prev.get(pid)
        prev[pid] = cur
        if p is None:
            continue
        dt = t - p["t"]
        if not dt > 0:
            skipped += 1
            continue
        hz = cur["clk_tck"] if finite(cur["clk_tck"]) and cur["clk_tck"] > 0 else DEFAULT_CLK_TCK
        usr = _rate(cur["utime"], p["utime"], dt, hz / 100.0)
        sys_ = _rate(cur["stime"], p["stime"], dt, hz / 100.0)
        migr = NAN
        if cur["tasks"] and p["tasks"]:
            moved = 0
            for tid, (name, ut, st, core, vcs, ivcs) in cur["tasks"].items():
                pt = p["tasks"].get(tid)
                if pt is None:
                    continue
                if core == core and pt[3] == pt[3] and core != pt[3]:
                    moved += 1
                tu, ts = _rate(ut, pt[1], dt, hz / 100.0), _rate(st, pt[2], dt, hz / 100.0)
                thread_rows.append([t, tid, name, tu + ts, tu, ts, core,
                                    _rate(vcs, pt[4], dt), _rate(ivcs, pt[5], dt)])
            migr = moved / dt
        process_rows.append([t, pid, usr + sys_, usr, sys_,
                             _rate(cur["wait_ns"], p["wait_ns"], dt, 1e7),
                             cur["rss_kb"] / KB_PER_MB, cur["vsz_kb"] / KB_PER_MB, cur["threads"],
                             _rate(cur["vol_cs"], p["vol_cs"], dt),
                             _rate(cur["invol_cs"], p["invol_cs"], dt), migr,
                             _rate(cur["minflt"], p["minflt"], dt),
                             _rate(cur["majflt"], p["majflt"], dt)])
    return process_rows, thread_rows, skipped


def frames_from_samples(samples: Iterable[dict]) -> tuple[dict, int]:
    """procfs-format sample dicts -> ({"process": df, "threads": df}, samples skipped)."""
    process_rows, thread_rows, skipped = rows_from_samples(samples)
    return ({"process": frame(process_rows, PROCESS_COLUMNS),
             "threads": frame(thread_rows, THREAD_COLUMNS)}, skipped)


def parse_procfs(text: str) -> Parsed:
    """procfs.jsonl text -> ``process`` and ``threads`` tables. Never raises."""
    samples, lines, bad = json_records(text)
    frames, skipped = frames_from_samples(samples)
    return Parsed(frames, lines, bad + skipped)


class ProcfsCollector(Collector):
    name = "procfs"
    raw_file = "procfs.jsonl"
    kind = "sampler"
    tables = ("process", "threads")
    output_tz = None
    #: pidstat -t already reads every thread each second; reading them twice doubles the cost
    #: (bench/agent_overhead.py: ~3.5% of a core for 256 threads).
    instead_of = "pidstat"

    def sampler_params(self, ctx: HostContext) -> dict[str, Any]:
        if ctx.pid is None:
            raise Unavailable("no monitored process (give pid, process or port)")
        if not ctx.facts.get("procfs"):
            raise Unavailable("/proc is not available")
        return {"pid": ctx.pid}

    def parse_text(self, text: str, tz: tzinfo | None, t0: float | None, interval: float) -> Parsed:
        return parse_procfs(text)


COLLECTOR = ProcfsCollector()

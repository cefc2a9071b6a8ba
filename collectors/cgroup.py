"""cgroup sampler output (cgroup.jsonl): the monitored process's container limits and throttling.

The sampler runs in the remote agent (``CgroupSampler``, stdlib only), at the monitor's interval,
or every THROTTLE_INTERVAL seconds where the cgroup has a CPU quota. It reads /proc/PID/cgroup,
finds the process's directory in the mounted hierarchy (/proc/self/mountinfo: a v1 hierarchy that
has the controller, else the unified v2 one), and writes ONE JSON OBJECT PER LINE, PER SAMPLE::

    {"t": 1796002084.01,     # epoch seconds (time.time()) when the sample was read
     "pid": 4041,            # the monitored process
     "ncpu": 64,             # os.cpu_count() on the host
     "version": 1,           # cgroup version of the cpu controller's hierarchy (1 or 2)
     "cpu_dir": "/sys/fs/cgroup/cpu/kubepods/pod1",  # the level whose quota binds (else the process's)
     "quota_us": 50000,      # cpu.cfs_quota_us (v1) / cpu.max's first field (v2) of that level,
                             #   the tightest quota/period of the process's cgroup and its ancestors;
                             #   null: no quota ("-1", "max")
     "period_us": 100000,    # cpu.cfs_period_us / cpu.max's second field
     "nr_periods": 120,      # cpu.stat of that level, CUMULATIVE: enforcement periods elapsed,
     "nr_throttled": 96,     #   periods in which the group was throttled,
     "throttled_ns": 4.1e10, #   time throttled (v1 throttled_time ns; v2 throttled_usec x 1000)
     "usage_ns": 6.0e10,     # optional: CPU time used (v2 usage_usec x 1000; v1 cpuacct.usage)
     "cpuset": "0-3",        # cpuset.effective_cpus (v1) / cpuset.cpus.effective (v2), else .cpus
     "cpuset_n": 4,          # the CPUs in that list
     "mem_limit": 2147483648,  # bytes: the tightest memory.limit_in_bytes / memory.max of the
                               #   process's memory cgroup and its ancestors; null: unlimited
     "mem_usage": 1073741824}  # memory.usage_in_bytes / memory.current of the process's cgroup

Any key may be missing or null (a controller not mounted, a file not there). Between full samples
(sampling every THROTTLE_INTERVAL under a quota) a line has only t, pid, cpu_dir and the counters.
A line with ``error`` (the process is gone; no hierarchy mounted) carries no counters.

Table ``cgroup`` (one row per sample; the interval columns NaN on a pid's first sample, and where
a counter went down or the cgroup changed):

  t, pid, version, quota_cpus (quota/period; NaN: no quota), cpuset_cpus, memory_limit_mb
  (NaN: none), memory_usage_mb, periods, throttled_periods, throttled_s (this interval's increase
  of nr_periods, nr_throttled, throttled time), usage_cpus (CPU seconds used per second).

The throttled share of a window is sum(throttled_periods) / sum(periods) over its rows: the
ratio the kernel's own counters give over the same span (kneeswarm.analysis.measure.serverstats).
"""
from __future__ import annotations

import logging
from datetime import tzinfo
from typing import Any, Iterable

from kneeswarm.collectors.base import (NAN, Collector, HostContext, Parsed, finite, frame, json_records, to_float)

logger = logging.getLogger(__name__)

BYTES_PER_MB = 1024.0 * 1024.0
# Seconds between samples, at most, of a process whose cgroup has a CPU quota when the agent starts
# (without one there is no throttling to time: it samples at the monitor's interval).  One CFS
# period (the kernel's default cpu.cfs_period_us, 100 ms).  A step's throttled share is read from
# the counters interpolated at its window's ends, and a sample interval that straddles an end (load
# rising into the next step, stopping after the last) mixes two regimes.  Measured on the half-CPU
# test run (5 s windows, ~50 periods): 1 s samples gave 0.96 where the kernel's counters over the
# window said 1.00, 0.25 s samples still 0.978 against 0.999 (one period off at an edge); 0.1 s
# agree within 1e-3.  The price, under a quota only: full samples every 0.1 s took the agent in
# bench/agent_overhead.py from 0.07 % to 0.53 % of a core, so between the full samples (at the
# monitor's interval) the sampler reads the counters alone: ~0.25 % of a core at 10 a second
# against ~0.1 % at 1 a second (measured on this 2-core machine, loaded), ~150 bytes a line.
THROTTLE_INTERVAL = 0.1
CGROUP_COLUMNS = ["t", "pid", "version", "quota_cpus", "cpuset_cpus", "memory_limit_mb", "memory_usage_mb",
                  "periods", "throttled_periods", "throttled_s", "usage_cpus"]
COUNTERS = ("nr_periods", "nr_throttled", "throttled_ns", "usage_ns")


def _delta(cur: float, prev: float) -> float:
    d = cur - prev
    return d if finite(d) and d >= 0 else NAN


def _limits(rec: dict) -> tuple[float, float, float, float, float]:
    """(version, quota CPUs, cpuset CPUs, memory limit MB, memory use MB) of one sample."""
    quota, period = to_float(rec.get("quota_us")), to_float(rec.get("period_us"))
    quota_cpus = quota / period if finite(quota) and finite(period) and quota > 0 and period > 0 else NAN
    cpuset = to_float(rec.get("cpuset_n"))
    mem = to_float(rec.get("mem_limit"))
    return (to_float(rec.get("version")), quota_cpus, cpuset if finite(cpuset) and cpuset > 0 else NAN,
            mem / BYTES_PER_MB if finite(mem) and mem > 0 else NAN, to_float(rec.get("mem_usage")) / BYTES_PER_MB)


def rows_from_samples(samples: Iterable[dict]) -> tuple[list[list], int]:
    """cgroup-format sample dicts -> (table rows, samples skipped)."""
    rows: list[list] = []
    skipped = 0
    prev: dict[int, tuple[dict[str, float], Any]] = {}  # pid: (its last counters and t, its cpu_dir)
    for rec in samples:
        t, pid_f = to_float(rec.get("t")), to_float(rec.get("pid"))
        if not (finite(t) and finite(pid_f)):
            skipped += 1
            continue
        if rec.get("error"):
            continue  # said, not measured: the process is gone or no hierarchy is mounted
        pid = int(pid_f)
        cur = {k: to_float(rec.get(k)) for k in COUNTERS}
        cur["t"], cpu_dir = t, rec.get("cpu_dir")
        p, p_dir = prev.get(pid, (None, None))
        prev[pid] = cur, cpu_dir
        d = {k: NAN for k in COUNTERS}
        if p is not None and t > p["t"] and p_dir == cpu_dir:
            d = {k: _delta(cur[k], p[k]) for k in COUNTERS}
        elif p is not None and not t > p["t"]:
            skipped += 1
            continue
        dt = t - p["t"] if p is not None else NAN
        rows.append([t, pid, *_limits(rec), d["nr_periods"], d["nr_throttled"], d["throttled_ns"] / 1e9,
                     d["usage_ns"] / 1e9 / dt if finite(dt) and dt > 0 else NAN])
    return rows, skipped


def parse_cgroup(text: str) -> Parsed:
    """cgroup.jsonl text -> the ``cgroup`` table. Never raises."""
    samples, lines, bad = json_records(text)
    rows, skipped = rows_from_samples(samples)
    return Parsed({"cgroup": frame(rows, CGROUP_COLUMNS)}, lines, bad + skipped)


class CgroupCollector(Collector):
    name = "cgroup"
    raw_file = "cgroup.jsonl"
    kind = "sampler"
    tables = ("cgroup",)
    output_tz = None

    def sampler_params(self, ctx: HostContext) -> dict[str, Any]:
        return {**self.process_params(ctx), "throttle_interval": THROTTLE_INTERVAL}

    def parse_text(self, text: str, tz: tzinfo | None, t0: float | None, interval: float) -> Parsed:
        return parse_cgroup(text)


COLLECTOR = CgroupCollector()

"""/proc sampler output (procfs.jsonl): the monitored service, read straight from /proc.

The default source of the ``process``, ``threads`` and ``tree`` tables where the host runs the
python agent (pidstat stands in where only the shell agent runs).  The service is the process
found and its descendants, its cgroup's processes, or it alone (``scope``: agents/remote/tree.py).
The sampler runs in the remote agent (stdlib only) and writes ONE JSON OBJECT PER LINE, PER SAMPLE
of the service; all counters are CUMULATIVE (as the kernel gives them), the parser differences
them.  The top-level counters are the service's (the sums over its processes, kept by
agents/remote/tree.py's Accounts so that they never fall when a process leaves; a file written
before the service was a tree holds the one process's own)::

    {"t": 1796002084.01,   # epoch seconds (time.time()) when the sample was read
     "pid": 4041,          # the process found (thread-group id)
     "scope": "tree",      # "tree", "cgroup" or "process" (absent in files before the tree)
     "utime": 1234,        # /proc/PID/stat field 14, clock ticks (all threads, live and dead), over
                           #   the service: each process's own and its reaped children's (field 16)
     "stime": 56,          # /proc/PID/stat field 15 (and 17), clock ticks
     "clk_tck": 100,       # os.sysconf("SC_CLK_TCK")
     "rss_kb": 11320,      # VmRSS (/proc/PID/stat field 24 x the page size), summed over the processes
     "vsz_kb": 235736,     # VmSize, summed likewise
     "threads": 4,         # threads, summed likewise
     "minflt": 3088,       # /proc/PID/stat field 10
     "majflt": 0,          # /proc/PID/stat field 12
     "ncpu": 2,            # os.cpu_count()
     "read_bytes": 0,      # optional: /proc/PID/io (the whole thread group; absent where unreadable)
     "write_bytes": 4096,  # optional: likewise
     # only in the thread samples (every ``thread_interval`` seconds; THREAD_INTERVAL):
     "vol_cs": 5120,       # voluntary_ctxt_switches SUMMED over /proc/PID/task/*/status
     "invol_cs": 877,      # nonvoluntary_ctxt_switches, summed likewise
                           #   (/proc/PID/status alone holds the main thread's only)
     "wait_ns": 81234567,  # run-queue wait, field 2 of /proc/PID/task/*/schedstat, summed
     "blkio_ticks": 3,     # block-IO delay, /proc/PID/task/*/stat field 42, summed (clock ticks)
     "tasks": [[4043, "spin0", 800, 2, 1, 4000, 600, 37], ...]}
                           # one per thread: [tid, comm, utime ticks, stime ticks,
                           #   processor (/proc/PID/task/TID/stat field 39), voluntary cs,
                           #   nonvoluntary cs, migrations (se.nr_migrations of
                           #   /proc/PID/task/TID/sched; absent where that file is not:
                           #   a kernel without CONFIG_SCHED_DEBUG)]
                           # The switches come from the same ``sched`` file where it is there
                           #   (the same counters as ``status``'s), else from ``status``.
     "procs": [[4041, 1, "python3", "listener", 1200, 50, 11320, 4, 5120, 877, 81234567], ...],
                           # each process of the service: [pid, ppid, comm, role (or null), its
                           #   own utime, stime (ticks), rss_kb, threads] and, in thread samples,
                           #   [its threads' vol cs, invol cs, run-queue wait ns] summed
     "joined": [[4042, 4041, 5811, "python3 -m worker"], ...],   # processes that joined since the
                           #   last sample: [pid, ppid, start time (ticks since boot), command line]
     "left": [4043],       # processes that left since the last sample
     "note": "..."}        # once: why the processes watched are not what the scope asked

Files written before the thread samples were thinned carry every key in every sample; both read the
same.  Numbers may be ints or floats. A missing key gives NaN. Each counter's rate is taken over
the span since the last sample of the pid that held it (one sample for the process's own counters,
one thread sample for the sums). A counter that goes down (pid reuse, a thread exiting from a
summed counter) gives NaN for that interval, never a negative rate.

Tables (one row per interval, stamped at its end, from the second sample of a pid on):

* ``process``: cpu_pct = (d utime + d stime) / clk_tck / dt * 100 (like pidstat's %CPU: can pass
  100 on several cores), usr_pct, sys_pct, rss_mb, vsz_mb, threads, minflt_s, majflt_s per second,
  io_read_kb_s, io_write_kb_s = d read_bytes, d write_bytes / 1024 / dt; on thread samples also
  wait_pct = d wait_ns / 1e9 / dt * 100, cswch_s, nvcswch_s, io_delay_pct = d blkio_ticks / clk_tck
  / dt * 100 and migrations_s = the kernel's migrations between two thread samples / dt
  (``kernel_migrations``: the increase of every thread's se.nr_migrations, summed), or, where a
  thread lacks that counter, the threads whose processor changed between the two samples / dt (a
  lower bound: one per thread however often it moved; pidstat's way); ``migrations_counted`` says
  which (kneeswarm.collectors.base.MIGRATIONS_KERNEL / MIGRATIONS_SAMPLED).  NaN on the rows between
  thread samples: the analysis averages what is there.
* ``threads``: from ``tasks``, for threads present in two consecutive thread samples.
* ``tree``: from ``procs``, one row per process per sample from its second on: its own cpu_pct
  (its own utime + stime, not its children's), rss_mb, threads and, on thread samples, cswch_s,
  nvcswch_s, wait_pct; ``cmdline`` (from ``joined``) on its first row.
"""
from __future__ import annotations

import logging
from datetime import tzinfo
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from kneeswarm.collectors.base import (MIGRATIONS_KERNEL, MIGRATIONS_SAMPLED, NAN, PROCESS_COLUMNS, THREAD_COLUMNS, TREE_COLUMNS,
                                       Collector, HostContext, Parsed, finite, frame, json_records, to_float,
                                       whole_line_pieces)

logger = logging.getLogger(__name__)

DEFAULT_CLK_TCK = 100.0
#: Seconds between two reads of every thread (three /proc files each; the process itself is read
#: every interval).  pidstat -t read them all each second: 1.75 % of a core with 256 threads and
#: SSH fetches (bench/agent_overhead.py; a soak's agent must cost <= 1 %).  A 3-second step still holds one.
THREAD_INTERVAL = 2.0
KB_PER_MB = 1024.0


def _rate(cur: float, prev: float, dt: float, scale: float = 1.0) -> float:
    d = cur - prev
    if d != d or d < 0:
        return NAN
    return d / scale / dt


#: One thread of a thread sample: (comm, utime, stime, processor, vol cs, invol cs, migrations).
Task = tuple[str, float, float, float, float, float, float]


def _tasks(v: object) -> dict[int, Task]:
    out: dict[int, Task] = {}
    if not isinstance(v, list):
        return out
    for task in v:
        if not isinstance(task, list) or len(task) < 7:
            continue
        tid = to_float(task[0])
        if not finite(tid):
            continue
        name = task[1] if isinstance(task[1], str) else str(task[1])
        ut, st, core, vcs, ivcs = (to_float(x) for x in task[2:7])
        migrations = to_float(task[7]) if len(task) > 7 else NAN
        out[int(tid)] = (name, ut, st, core, vcs, ivcs, migrations)
    return out


#: Cumulative counters of a sample, differenced against the last sample of the pid that had each
#: (the thread sums and /proc/PID/io come with some samples only).
COUNTERS = ("utime", "stime", "vol_cs", "invol_cs", "minflt", "majflt", "wait_ns", "blkio_ticks",
            "read_bytes", "write_bytes")


class _Pid:
    """What one pid's earlier samples left: per counter the last (t, value), and the last tasks."""

    def __init__(self) -> None:
        self.last: dict[str, tuple[float, float]] = {}
        self.tasks: tuple[float, dict] | None = None
        self.t: float | None = None  # the time of its last sample

    def rate(self, key: str, t: float, value: float) -> float:
        """d value / dt since the last sample holding ``key``; remembers this one."""
        prev = self.last.get(key)
        if not finite(value):
            return NAN
        self.last[key] = (t, value)
        if prev is None or not t > prev[0]:
            return NAN
        return _rate(value, prev[1], t - prev[0])


def kernel_migrations(cur: dict[int, Task], before: dict[int, Task]) -> float:
    """Migrations between two thread samples by the kernel's own counters (se.nr_migrations):
    the increase of each thread's counter, a thread new since ``before`` counted from zero (the
    kernel starts it at 0 when the thread is created).  The sum over the threads, differenced per
    thread, so that a thread exiting between the samples takes only its own last moves away,
    never makes the interval unreadable.  NaN unless every thread carries the counter."""
    total = 0.0
    for tid, task in cur.items():
        m = task[6]
        if not finite(m):
            return NAN
        prev = before.get(tid)
        d = m - prev[6] if prev is not None and finite(prev[6]) else m
        total += d if d >= 0 else m  # a counter that went down: the tid was reused by a new thread
    return total


def _thread_rows(t: float, cur: dict[int, Task], prev: tuple[float, dict[int, Task]],
                 tick_scale: float) -> tuple[list[list], float, float]:
    """The threads present in two thread samples -> (thread rows, migrations/s, how they were
    counted: MIGRATIONS_KERNEL or MIGRATIONS_SAMPLED)."""
    t_prev, before = prev
    dt = t - t_prev
    rows: list[list] = []
    if not dt > 0:
        return rows, NAN, NAN
    moved = 0
    for tid, (name, ut, st, core, vcs, ivcs, _) in cur.items():
        pt = before.get(tid)
        if pt is None:
            continue
        if core == core and pt[3] == pt[3] and core != pt[3]:
            moved += 1
        tu, ts = _rate(ut, pt[1], dt, tick_scale), _rate(st, pt[2], dt, tick_scale)
        rows.append([t, tid, name, tu + ts, tu, ts, core, _rate(vcs, pt[4], dt), _rate(ivcs, pt[5], dt)])
    counted = kernel_migrations(cur, before) if cur else NAN
    if finite(counted):
        return rows, counted / dt, MIGRATIONS_KERNEL
    return rows, moved / dt, MIGRATIONS_SAMPLED


class ProcfsStream:
    """procfs.jsonl read a piece at a time (:meth:`feed_text`, whole lines); :meth:`take` returns
    the rows read so far as the two tables and forgets them, keeping each pid's last counters so
    that the next piece's first sample is differenced against them.

    Why a stream: the /proc sampler is the default source of the process and its threads, and the
    live view parses after every fetch; fed only what a fetch added, ``take()`` gives the new rows
    only, where parsing the whole file each time would cost ever more over a long run of a
    many-thread process (as kneeswarm.collectors.pidstat.PidstatStream for pidstat's text).  A sample is
    whole in its line, so ``take()`` holds nothing back (``final`` is accepted for the same call).
    """

    def __init__(self) -> None:
        self.pids: dict[int, _Pid] = {}
        self.members: dict[int, _Pid] = {}  # each process of the service, by pid (``procs``)
        self.cmdlines: dict[int, str] = {}  # a joined process's command line, until its first tree row
        self.process_rows: list[list] = []
        self.thread_rows: list[list] = []
        self.tree_rows: list[list] = []
        self.lines = self.skipped = 0

    def feed_text(self, text: str) -> None:
        samples, lines, bad = json_records(text)
        self.lines += lines
        self.skipped += bad
        self.feed(samples)

    def feed(self, samples: Iterable[object]) -> None:
        for rec in samples:
            if not (isinstance(rec, dict) and self._sample(rec)):
                self.skipped += 1

    def _sample(self, rec: dict) -> bool:
        """One sample's rows (none for a pid's first); False when it cannot be read."""
        t, pid_f = to_float(rec.get("t")), to_float(rec.get("pid"))
        if not (finite(t) and finite(pid_f)):
            return False
        pid = int(pid_f)
        first = pid not in self.pids
        p = self.pids.setdefault(pid, _Pid())
        if p.t is not None and not t > p.t:
            return False
        p.t = t
        clk = to_float(rec.get("clk_tck"))
        hz = clk if finite(clk) and clk > 0 else DEFAULT_CLK_TCK
        r = {k: p.rate(k, t, to_float(rec.get(k))) for k in COUNTERS}
        tasks = _tasks(rec.get("tasks")) if "tasks" in rec else None
        migr = counted = NAN
        if tasks is not None:
            if p.tasks is not None:
                rows, migr, counted = _thread_rows(t, tasks, p.tasks, hz / 100.0)
                self.thread_rows += rows
            p.tasks = (t, tasks)
        self._members(t, rec, hz)
        if first:
            return True
        usr, sys_ = r["utime"] / (hz / 100.0), r["stime"] / (hz / 100.0)
        self.process_rows.append([t, pid, usr + sys_, usr, sys_, r["wait_ns"] / 1e7,
                                  to_float(rec.get("rss_kb")) / KB_PER_MB, to_float(rec.get("vsz_kb")) / KB_PER_MB,
                                  to_float(rec.get("threads")), r["vol_cs"], r["invol_cs"], migr, r["minflt"],
                                  r["majflt"], r["read_bytes"] / 1024.0, r["write_bytes"] / 1024.0,
                                  r["blkio_ticks"] / hz * 100.0, counted])
        return True

    def _members(self, t: float, rec: dict, hz: float) -> None:
        """The ``tree`` rows of one sample's ``procs`` (each process's own figures)."""
        for j in rec.get("joined") or []:
            if isinstance(j, list) and len(j) >= 4 and isinstance(j[3], str) and finite(to_float(j[0])):
                self.cmdlines[int(to_float(j[0]))] = j[3]
        for pid in rec.get("left") or []:
            if finite(to_float(pid)):
                self.members.pop(int(to_float(pid)), None)
                self.cmdlines.pop(int(to_float(pid)), None)
        procs = rec.get("procs")
        for proc in procs if isinstance(procs, list) else []:
            if not isinstance(proc, list) or len(proc) < 8 or not finite(pid_f := to_float(proc[0])):
                continue
            pid = int(pid_f)
            m = self.members.setdefault(pid, _Pid())
            if m.t is not None and not t > m.t:
                continue
            first, m.t = m.t is None, t
            used = to_float(proc[4]) + to_float(proc[5])
            cpu = m.rate("cpu", t, used) / (hz / 100.0)
            sw = [m.rate(k, t, to_float(proc[i])) for k, i in (("vol", 8), ("invol", 9), ("wait", 10))] \
                if len(proc) >= 11 else [NAN, NAN, NAN]
            if first:
                continue
            name, role = proc[2], proc[3]
            self.tree_rows.append([t, pid, to_float(proc[1]), name if isinstance(name, str) else str(name),
                                   role if isinstance(role, str) else None, cpu, to_float(proc[6]) / KB_PER_MB,
                                   to_float(proc[7]), sw[0], sw[1], sw[2] / 1e7, self.cmdlines.pop(pid, None)])

    def take(self, final: bool = True) -> Parsed:
        """The rows read since the last ``take`` as ``process`` and ``threads``, and their line counts."""
        out = Parsed({"process": frame(self.process_rows, PROCESS_COLUMNS),
                      "threads": frame(self.thread_rows, THREAD_COLUMNS),
                      "tree": frame(self.tree_rows, TREE_COLUMNS, ints=("pid",))}, self.lines, self.skipped)
        self.process_rows, self.thread_rows, self.tree_rows = [], [], []
        self.lines = self.skipped = 0
        return out


def rows_from_samples(samples: Iterable[dict]) -> tuple[list[list], list[list], int]:
    """procfs-format sample dicts -> (process rows, thread rows, samples skipped)."""
    stream = ProcfsStream()
    stream.feed(samples)
    return stream.process_rows, stream.thread_rows, stream.skipped


def frames_from_samples(samples: Iterable[dict]) -> tuple[dict, int]:
    """procfs-format sample dicts -> ({"process": df, "threads": df}, samples skipped)."""
    process_rows, thread_rows, skipped = rows_from_samples(samples)
    return ({"process": frame(process_rows, PROCESS_COLUMNS),
             "threads": frame(thread_rows, THREAD_COLUMNS)}, skipped)


def parse_procfs(text: str) -> Parsed:
    """procfs.jsonl text -> ``process`` and ``threads`` tables. Never raises."""
    stream = ProcfsStream()
    stream.feed_text(text)
    return stream.take(final=True)


def parse_procfs_file(path: Path, piece: int = 1 << 22) -> Parsed:
    """:func:`parse_procfs` of a file's text (UTF-8, bad bytes replaced), read ``piece`` characters
    of whole lines at a time, each piece's rows taken as typed tables: neither the whole text nor
    every sample's records are held (2 h of a 256-thread process: 48 MB of JSON lines, 1 GB as
    Python records and rows).  The same tables as the whole text's parse."""
    stream = ProcfsStream()
    parts: dict[str, list[pd.DataFrame]] = {"process": [], "threads": [], "tree": []}
    lines = skipped = 0
    for text in whole_line_pieces(path, piece):
        stream.feed_text(text)
        got = stream.take()
        lines, skipped = lines + got.lines, skipped + got.skipped
        for name, df in got.frames.items():
            if len(df):
                parts[name].append(df)
    return Parsed({name: pd.concat(dfs, ignore_index=True) if dfs else frame([], columns)
                   for (name, dfs), columns in zip(parts.items(), (PROCESS_COLUMNS, THREAD_COLUMNS, TREE_COLUMNS))},
                  lines, skipped)


class ProcfsCollector(Collector):
    name = "procfs"
    raw_file = "procfs.jsonl"
    kind = "sampler"
    tables = ("process", "threads", "tree")
    output_tz = None

    def sampler_params(self, ctx: HostContext) -> dict[str, Any]:
        return {**self.process_params(ctx), "thread_interval": max(ctx.interval, THREAD_INTERVAL),
                "scope": ctx.scope, "port": ctx.port}

    def parse_text(self, text: str, tz: tzinfo | None, t0: float | None, interval: float) -> Parsed:
        return parse_procfs(text)

    def parse_file_unguarded(self, path: Path, tz: tzinfo | None, t0: float | None, interval: float) -> Parsed:
        return parse_procfs_file(path)


COLLECTOR = ProcfsCollector()

"""The in-process samplers' base (a thread writing one JSON line per interval) and the samplers of
the monitored service (tree.py: a process tree, a cgroup's processes or one process): /proc (its
threads read less often), NVML, its open file descriptors."""

import json
import os
import threading
import time

from .common import log_line, wall_time, pause
from .defaults import LOOP_PERIOD, MAX_TASKS, SCOPE_PROCESS
from .files import read_text
from .processes import read_stat
from .tree import CPU_PAIRS, PLAIN_COUNTERS, TASK_COUNTERS, Accounts, ServiceTree, uptime_ticks


class Sampler(threading.Thread):
    """Writes one JSON line per interval to its raw file until ``stopping`` is set.

    A sampler is built as ``cls(name, path, interval, stopping, **params)`` with the ``params``
    its collector declared (``Collector.sampler_params``)."""

    def __init__(self, name: str, path: str, interval: float, stopping: threading.Event):
        super().__init__(name=f"sampler-{name}", daemon=True)
        self.cname = name
        self.path = path
        self.interval = interval
        self.stopping = stopping
        self.error: str | None = None
        self.lines = 0

    def setup(self) -> None:  # may raise: the sampler then does not run
        pass

    def sample(self, t: float) -> "list[dict]":
        raise NotImplementedError

    def teardown(self) -> None:
        pass

    def run(self) -> None:
        try:
            with open(self.path, "a", buffering=1) as out:
                t0 = time.monotonic()
                k = 0
                while not self.stopping.is_set():
                    t = wall_time()
                    try:
                        rows = self.sample(t)
                    except Exception as e:  # one bad sample must not end the sampler
                        rows = [{"t": round(t, 3), "error": f"{type(e).__name__}: {e}"}]
                    for row in rows:
                        out.write(json.dumps(row) + "\n")
                        self.lines += 1
                    k += 1
                    nxt = t0 + k * self.interval
                    while not self.stopping.is_set():
                        left = nxt - time.monotonic()
                        if left <= 0:
                            break
                        pause(min(left, LOOP_PERIOD))
        except Exception as e:
            self.error = f"{type(e).__name__}: {e}"
            log_line(f"sampler {self.cname} failed: {self.error}")
        finally:
            try:
                self.teardown()
            except Exception:
                pass


def _status_nums(text: str) -> "dict[str, int]":
    out = {}
    for line in text.splitlines():
        k, _, v = line.partition(":")
        parts = v.split()
        if parts and parts[0].isdigit():
            out[k] = int(parts[0])
    return out


def _status_value(text: str, key: str) -> int:
    """One number of a /proc status text (0 when absent): a search, not a parse of all 55 lines,
    which was two thirds of a thread sample's cost."""
    i = text.find("\n" + key + ":")
    if i < 0:
        return 0
    start = i + len(key) + 2
    end = text.find("\n", start)
    try:
        return int(text[start:end if end >= 0 else len(text)])
    except ValueError:
        return 0


def _sched_value(text: str, key: str) -> "int | None":
    """One counter of a /proc sched text ("se.nr_migrations    :    12"; None when absent), found
    by a search as ``_status_value`` does."""
    i = text.find("\n" + key + " ")
    if i < 0:
        return None
    start = text.find(":", i) + 1
    end = text.find("\n", start)
    try:
        return int(text[start:end if end >= 0 else len(text)])
    except ValueError:
        return None


class ProcfsSampler(Sampler):
    """Cumulative counters of the monitored service and its threads from /proc (collectors/procfs.py).

    The service is the process found and its descendants, its cgroup's processes or the process
    alone (``scope``, tree.py), listed again at every sample.  Every member's stat and io are read
    every ``interval``; their threads (three files each: stat, sched -- or status where sched is
    missing -- and schedstat) every ``thread_interval`` seconds only, since with hundreds of
    threads they are nearly all the cost (left on through hours of soak, it must cost < 1 % of a core).  The
    sums that need every thread (context switches, run delay, block-IO delay) come with the thread
    samples; the parser takes their rates over the span between two of them.  A line holds the
    tree's counters (tree.Accounts: they never fall when a member leaves) and, in ``procs``, each
    member's own; ``joined`` and ``left`` say when the members changed."""

    def __init__(self, name, path, interval, stopping, pid: int, thread_interval: float = None, scope: str = None,
                 port: int = None):
        super().__init__(name, path, interval, stopping)
        self.pid = int(pid)
        self.clk_tck = os.sysconf("SC_CLK_TCK")
        self.ncpu = os.cpu_count() or 1
        self.page_kb = os.sysconf("SC_PAGE_SIZE") // 1024
        self.thread_every = max(1, int(round(float(thread_interval) / interval))) if thread_interval else 1
        self.k = 0
        self.read_sched = True  # /proc/PID/task/TID/sched readable (until a thread shows otherwise)
        self._gone_reported = False
        self.tree = ServiceTree(self.pid, scope, port)
        kids = self.tree.scope != SCOPE_PROCESS  # the process alone: not its children's time
        self.accounts = Accounts(PLAIN_COUNTERS, CPU_PAIRS if kids else tuple((own, None) for own, _ in CPU_PAIRS))
        self.task_accounts = Accounts(TASK_COUNTERS)
        self.mark = self.task_mark = None  # uptime ticks at the last sample / thread sample (tree.Accounts)
        self._noted = False

    def _switches(self, tb: str) -> "tuple[int, int, int | None]":
        """(voluntary cs, involuntary cs, migrations or None) of one thread: from its ``sched``
        file (the same p->nvcsw / p->nivcsw as ``status``'s, and the kernel's migration count
        se.nr_migrations), else from ``status`` (a kernel without CONFIG_SCHED_DEBUG has no
        ``sched``: tried once, then never again).  Raises OSError when the thread is gone."""
        if self.read_sched:
            try:
                text = read_text(tb + "/sched")
            except OSError:
                text = None
            if text is not None:
                v, nv = _sched_value(text, "nr_voluntary_switches"), _sched_value(text, "nr_involuntary_switches")
                if v is not None and nv is not None:
                    return v, nv, _sched_value(text, "se.nr_migrations")
        ts = read_text(tb + "/status")  # the thread exited between listdir and read: OSError
        self.read_sched = False  # status read where sched was not: sched is not there to read
        return _status_value(ts, "voluntary_ctxt_switches"), _status_value(ts, "nonvoluntary_ctxt_switches"), None

    def _tasks(self, base: str, limit: int, values: dict) -> "tuple[list, list]":
        """One process's threads: (rows [tid, comm, utime, stime, processor, vol cs, invol cs,
        migrations] -- the last only where the kernel gives it --, its sums [vol cs, invol cs,
        run-queue wait ns]); each thread's counters (and block-IO delay, clock ticks, stat field
        42) go to ``values`` {tid: (start, None, counters)} for the tree's sums."""
        vol = invol = wait_ns = 0
        tasks = []
        try:
            tids = sorted(int(x) for x in os.listdir(base + "/task") if x.isdigit())[:max(0, limit)]
        except OSError:
            tids = []
        for tid in tids:
            tb = "%s/task/%d" % (base, tid)
            st = read_stat(tb + "/stat")
            try:
                v, nv, migrations = self._switches(tb)
            except OSError:
                continue  # the thread exited between listdir and read
            try:
                wait = int(read_text(tb + "/schedstat").split()[1])
            except (OSError, IndexError, ValueError):
                wait = None
            vol, invol, wait_ns = vol + v, invol + nv, wait_ns + (wait or 0)
            try:
                if st is not None:
                    row = [tid, st.comm, st.int(14), st.int(15), st.int(39), v, nv]
                    tasks.append(row if migrations is None else row + [migrations])
                    values[tid] = (st.int(22), None, {"vol_cs": v, "invol_cs": nv, "wait_ns": wait,
                                                      "blkio_ticks": st.int(42)})
            except (IndexError, ValueError):
                pass
        return tasks, [vol, invol, wait_ns]

    @staticmethod
    def _io(base: str) -> dict:
        """The process's disk bytes (/proc/PID/io, the whole thread group: what pidstat -d reads);
        {} where it may not be read (another user's process)."""
        try:
            nums = _status_nums(read_text(base + "/io"))
        except OSError:
            return {}
        return {k: nums[k] for k in ("read_bytes", "write_bytes") if k in nums}

    def _gone(self, t: float) -> "list[dict]":
        if self._gone_reported:
            return []
        self._gone_reported = True
        return [{"t": round(t, 3), "pid": self.pid, "error": "process gone (No such process)"}]

    def sample(self, t: float) -> "list[dict]":
        mark, self.mark = self.mark, uptime_ticks(self.clk_tck)
        stats = self.tree.scan()
        if not stats:
            return self._gone(t)
        values, procs = {}, []
        rss = vsz = threads = 0
        io_whole = True
        for pid, st in stats.items():
            m = self.tree.members[pid]
            v = {"utime": st.int(14), "stime": st.int(15), "cutime": st.int(16), "cstime": st.int(17),
                 "minflt": st.int(10), "majflt": st.int(12)}
            io = self._io("/proc/%d" % pid)
            io_whole = io_whole and len(io) == 2
            v.update(io)
            values[pid] = (m.start, m.ppid, v)
            rss_kb, n = st.int(24) * self.page_kb, st.int(20)
            rss, vsz, threads = rss + rss_kb, vsz + st.int(23) // 1024, threads + n
            procs.append([pid, m.ppid, m.comm, m.role, v["utime"], v["stime"], rss_kb, n])
        self.accounts.advance(values, mark)
        tot = self.accounts.totals
        row = {
            "t": round(t, 3), "pid": self.pid, "scope": self.tree.watched_scope, "utime": tot["utime"],
            "stime": tot["stime"], "clk_tck": self.clk_tck, "rss_kb": rss, "vsz_kb": vsz, "threads": threads,
            "minflt": tot["minflt"], "majflt": tot["majflt"], "ncpu": self.ncpu,
        }
        if io_whole:  # every member's disk bytes were readable: the tree's sums
            row.update(read_bytes=tot["read_bytes"], write_bytes=tot["write_bytes"])
        if self.k % self.thread_every == 0:
            self._thread_sample(row, procs, stats)
        row["procs"] = procs
        if self.tree.joined:
            row["joined"] = [[m.pid, m.ppid, m.start, m.cmdline] for m in self.tree.joined]
        if self.tree.left:
            row["left"] = self.tree.left
        if self.tree.note and not self._noted:
            row["note"], self._noted = self.tree.note, True
        self.k += 1
        return [row]

    def _thread_sample(self, row: dict, procs: list, stats: dict) -> None:
        """Every member's threads: ``tasks``, each member's sums (appended to its ``procs`` row)
        and the tree's sums (tree.Accounts over the threads)."""
        mark, self.task_mark = self.task_mark, uptime_ticks(self.clk_tck)
        values, tasks = {}, []  # type: dict, list
        for proc in procs:
            rows, sums = self._tasks("/proc/%d" % proc[0], MAX_TASKS - len(tasks), values)
            tasks += rows
            proc += sums
        if not tasks:  # threads unreadable: the main thread's counters, as before
            try:
                status = _status_nums(read_text("/proc/%d/status" % self.pid))
            except OSError:
                status = {}
            row.update(vol_cs=status.get("voluntary_ctxt_switches"),
                       invol_cs=status.get("nonvoluntary_ctxt_switches"), tasks=tasks)
            return
        self.task_accounts.advance(values, mark)
        row.update(self.task_accounts.totals)
        row["tasks"] = tasks


class NvmlSampler(Sampler):
    """GPU and per-process GPU samples through NVML (``import pynvml``), one line per GPU."""

    def setup(self) -> None:
        try:
            import pynvml  # optional: nvidia-ml-py
        except ImportError:
            raise RuntimeError("pynvml (nvidia-ml-py) is not installed") from None
        self.nv = pynvml
        pynvml.nvmlInit()
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        self.last_t = None  # type: float | None

    def teardown(self) -> None:
        try:
            self.nv.nvmlShutdown()
        except Exception:
            pass

    def sample(self, t: float) -> "list[dict]":
        since = self.last_t if self.last_t is not None else t - 2 * self.interval
        self.last_t = t
        return [self._gpu(i, h, t, since) for i, h in enumerate(self.handles)]

    def _gpu(self, i: int, h, t: float, since: float) -> dict:
        nv = self.nv
        row: dict = {"t": round(t, 3), "gpu": i}
        calls = {
            "util": lambda: (lambda u: [u.gpu, u.memory])(nv.nvmlDeviceGetUtilizationRates(h)),
            "mem": lambda: (lambda m: [m.used, m.total])(nv.nvmlDeviceGetMemoryInfo(h)),
            "power_mw": lambda: nv.nvmlDeviceGetPowerUsage(h),
            "sm_clock_mhz": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            "mem_clock_mhz": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
            "temp_c": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            "procs": lambda: [[p.pid, p.usedGpuMemory] for p in nv.nvmlDeviceGetComputeRunningProcesses(h)],
            "proc_util": lambda: [[s.pid, s.smUtil, s.memUtil]
                                  for s in nv.nvmlDeviceGetProcessUtilization(h, int(since * 1e6))],
        }
        for key, fn in calls.items():
            try:
                row[key] = fn()
            except nv.NVMLError as e:
                row[key] = None
                row.setdefault("errors", {})[key] = str(e)
        return row


class FdSampler(Sampler):
    """The monitored service's open file descriptors: the entries of /proc/PID/fd of each of its
    processes (tree.py; collectors/fds.py), summed, and each one's in ``procs``.  pidstat has no
    such count, and a soak's fd_growth reads it; one listdir per process per sample."""

    def __init__(self, name, path, interval, stopping, pid, scope=None):
        super().__init__(name, path, interval, stopping)
        self.pid = int(pid)
        self.tree = ServiceTree(self.pid, scope, identify=False)
        self._error_reported = False

    def _error(self, t, text):
        if self._error_reported:
            return []
        self._error_reported = True  # said once (process gone, or not ours to read)
        return [{"t": round(t, 3), "pid": self.pid, "error": text}]

    def sample(self, t):
        stats = self.tree.scan()
        if not stats:
            return self._error(t, "/proc/%d/fd: No such process" % self.pid)
        procs, unreadable, why = [], 0, None
        for pid in stats:
            try:
                procs.append([pid, len(os.listdir("/proc/%d/fd" % pid))])
            except OSError as e:
                unreadable, why = unreadable + 1, why or "/proc/%d/fd: %s" % (pid, e.strerror)
        if not procs:
            return self._error(t, why)
        row = {"t": round(t, 3), "pid": self.pid, "fds": sum(n for _, n in procs), "procs": procs}
        if unreadable:
            row["unreadable"] = unreadable
        return [row]

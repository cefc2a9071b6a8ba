"""cgroup (v1 or v2): the monitored process's CPU quota, cpuset, memory limit and throttling
(collectors/cgroup.py parses what this writes)."""

import os

from .cgroupfs import CGROUP_FS_VERSION, cgroup_dir, cgroup_mounts, cgroup_paths  # noqa: F401 (re-exported)
from .files import read_text
from .samplers import Sampler


CGROUP_UNLIMITED = 1 << 62  # v1's "no memory limit" is PAGE_COUNTER_MAX x page size (~2^63)


def _cgroup_levels(d, top):
    """``d`` and its ancestors up to the mount point ``top``, innermost first."""
    out = [d]
    while d != top and len(d) > len(top):
        d = os.path.dirname(d)
        out.append(d)
    return out


def _read_first(d, names):
    for n in names:
        try:
            return read_text(os.path.join(d, n)).strip()
        except OSError:
            continue
    return None


def _int_or_none(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def cpuset_count(text):
    """The number of CPUs in a cpuset list ("0-3,8,10-11" -> 7); None for an empty or bad list."""
    n = 0
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            n += int(hi or lo) - int(lo) + 1
        except ValueError:
            return None
    return n or None


def _cpu_quota(version, d):
    """(quota us, period us) of one level; quota None when unlimited."""
    if version == 2:
        parts = (_read_first(d, ["cpu.max"]) or "").split()
        if len(parts) == 2:
            return _int_or_none(parts[0]), _int_or_none(parts[1])
        return None, None
    q, p = _int_or_none(_read_first(d, ["cpu.cfs_quota_us"])), _int_or_none(_read_first(d, ["cpu.cfs_period_us"]))
    return (q if q is not None and q > 0 else None), p


def _cpu_stat(d):
    out = {}
    for line in (_read_first(d, ["cpu.stat"]) or "").splitlines():
        k, _, v = line.partition(" ")
        n = _int_or_none(v.strip())
        if n is not None:
            out[k] = n
    return out


class CgroupSampler(Sampler):
    """The monitored process's cgroup (v1 or v2): CPU quota and period, cpuset, memory limit and
    use, and the cumulative throttling counters of the level whose quota binds.

    Where a CPU quota is set when it starts, it samples every ``throttle_interval`` seconds (when
    shorter than its interval), since throttling is read over step windows whose ends need finer
    samples: every sample between two full ones reads only the throttling counters (cpu.stat, and
    cpuacct.usage where it is there), the full ones come at the given interval."""

    def __init__(self, name, path, interval, stopping, pid, throttle_interval=None):
        super().__init__(name, path, interval, stopping)
        self.pid = int(pid)
        self.throttle_interval = throttle_interval
        self.full_every = 1  # one full sample in this many
        self.fast = None  # (version, directory, cpuacct directory or None) of the counters, between full samples
        self.k = 0
        self.mounts = {}
        self.mountinfo_file = "/proc/self/mountinfo"
        self.cgroup_file = "/proc/%d/cgroup" % self.pid
        self._gone_reported = False

    def setup(self):
        try:
            self.mounts = cgroup_mounts(read_text(self.mountinfo_file))
        except OSError:
            self.mounts = {}
        if self.throttle_interval and float(self.throttle_interval) < self.interval:
            probe = {}  # type: dict
            try:
                self.read(cgroup_paths(read_text(self.cgroup_file)), probe)
            except OSError:
                pass
            if probe.get("quota_us"):
                self.full_every = max(1, int(round(self.interval / float(self.throttle_interval))))
                self.interval = self.interval / self.full_every

    def read(self, paths, row):
        """Add to ``row`` what the cgroup files say for the cgroup ``paths`` of /proc/PID/cgroup."""
        self._cpu(paths, row)
        self._cpuset_memory(paths, row)

    def _counters(self, version, stat_dir, acct, row):
        st = _cpu_stat(stat_dir)
        row.update(cpu_dir=stat_dir, nr_periods=st.get("nr_periods"), nr_throttled=st.get("nr_throttled"),
                   throttled_ns=st.get("throttled_time") if version == 1 else
                   (st["throttled_usec"] * 1000 if "throttled_usec" in st else None))
        if version == 2 and "usage_usec" in st:
            row["usage_ns"] = st["usage_usec"] * 1000
        elif version == 1 and acct:  # the same group's cpuacct.usage (_cpuacct_dir)
            row["usage_ns"] = _int_or_none(_read_first(acct, ["cpuacct.usage"]))

    def _cpu(self, paths, row):
        version, d = cgroup_dir(self.mounts, paths, "cpu", "cpu.max")
        if d is None:
            return
        top = self.mounts["cpu" if version == 1 else ""][1]
        best, stat_dir = None, d
        for level in _cgroup_levels(d, top):  # the tightest quota of the process and its ancestors
            quota, period = _cpu_quota(version, level)
            if quota and period and (best is None or quota / period < best[0] / best[1]):
                best, stat_dir = (quota, period), level
        if best is None:
            best = (None, _cpu_quota(version, d)[1])
        row.update(version=version, quota_us=best[0], period_us=best[1])
        acct = self._cpuacct_dir(paths, d, stat_dir) if version == 1 else None
        self._counters(version, stat_dir, acct, row)
        self.fast = (version, stat_dir, acct)

    def _cpuacct_dir(self, paths, d, stat_dir):
        """The v1 directory whose cpuacct.usage is the CPU time of the group ``stat_dir`` (in the
        cpu hierarchy, ``d`` being the process's own group there), or None.  With cpu and cpuacct
        mounted together ("cpu,cpuacct", the usual layout) it is ``stat_dir`` itself.  Mounted
        apart (two hierarchies, as on this project's test machine), it is the same level of the
        process's cpuacct group -- only where the process sits in the same group in both (a
        container runtime makes the same path in every hierarchy); a process moved into a cpu
        group alone is still in another cpuacct group (the root: the whole host's time), which
        says nothing of the group whose quota binds."""
        if os.path.exists(os.path.join(stat_dir, "cpuacct.usage")):
            return stat_dir
        if "cpuacct" not in paths or paths.get("cpuacct") != paths.get("cpu"):
            return None
        version, acct = cgroup_dir(self.mounts, paths, "cpuacct", "cpu.stat")
        if version != 1:
            return None
        for _ in range(len(_cgroup_levels(d, stat_dir)) - 1):  # up as many levels as stat_dir is
            acct = os.path.dirname(acct)
        return acct if os.path.exists(os.path.join(acct, "cpuacct.usage")) else None

    def _cpuset_memory(self, paths, row):
        version, d = cgroup_dir(self.mounts, paths, "cpuset", "cpuset.cpus.effective")
        if d is not None:
            names = ["cpuset.cpus.effective", "cpuset.cpus"] if version == 2 else ["cpuset.effective_cpus", "cpuset.cpus"]
            row["cpuset"] = _read_first(d, names)
            row["cpuset_n"] = cpuset_count(row["cpuset"])
        version, d = cgroup_dir(self.mounts, paths, "memory", "memory.max")
        if d is None:
            return
        limits = []
        for level in _cgroup_levels(d, self.mounts["memory" if version == 1 else ""][1]):
            v = _int_or_none(_read_first(level, ["memory.max" if version == 2 else "memory.limit_in_bytes"]))
            if v is not None and v < CGROUP_UNLIMITED:
                limits.append(v)
        row["mem_limit"] = min(limits) if limits else None
        row["mem_usage"] = _int_or_none(_read_first(d, ["memory.current" if version == 2 else "memory.usage_in_bytes"]))

    def sample(self, t):
        self.k += 1
        if self.fast is not None and (self.k - 1) % self.full_every:
            row = {"t": round(t, 3), "pid": self.pid}
            self._counters(self.fast[0], self.fast[1], self.fast[2], row)
            return [row]
        try:
            paths = cgroup_paths(read_text(self.cgroup_file))
        except OSError as e:
            self.fast = None
            if self._gone_reported:
                return []
            self._gone_reported = True
            return [{"t": round(t, 3), "pid": self.pid, "error": "process gone (%s)" % (e.strerror or e)}]
        row = {"t": round(t, 3), "pid": self.pid, "ncpu": os.cpu_count()}
        self.read(paths, row)
        if "version" not in row and "cpuset" not in row and "mem_limit" not in row:
            if self._gone_reported:
                return []
            self._gone_reported = True  # said once, not at every sample
            return [{"t": row["t"], "pid": self.pid, "error": "no cgroup hierarchy of the process is mounted here"}]
        return [row]

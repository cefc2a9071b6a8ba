#!/usr/bin/env python3
"""kneeswarm remote agent: one file, python3 standard library only (pynvml used when present).

It runs on every python3 from 3.6 up (RHEL 8's and Ubuntu 18.04's default): no syntax or library
call newer than 3.6 -- no ``from __future__ import annotations`` (annotations that name newer types
are strings), no walrus, no dataclasses, no ``capture_output``/``text=`` -- checked by
tests/test_agent_pythons.py under every interpreter the machine has.

It is uploaded (by SFTP, through the exec channel, or copied for ``local``) into a per-run
directory on the monitored server and driven by the controller (agents/host.py) through verbs:

    remote.py preflight [CONFIG.json | '{json}']   facts about the host, as JSON on stdout
    remote.py start CONFIG.json                    daemonise, start collectors; JSON on stdout
    remote.py watch DIR                            the controller's heartbeat channel (below)
    remote.py stop DIR                             stop everything, write MANIFEST.json
    remote.py echo                                 line echo with timestamps (clock offset)

The run directory holds the config (agent.json), one raw file per collector exactly as the tool
printed it (stderr in <name>.err), the JSON-lines output of the in-process samplers, agent.pid,
status.json, agent.log and, once stopped, MANIFEST.json (sha256 and size of every file).

What runs is read from agent.json["collectors"]: each entry has ``argv`` (+ ``env``), a command
run in its own session, or ``sampler`` (a name in ``SAMPLERS``) + ``params``, a thread here. The
agent knows no collector by name.

Nothing is left running when the controller goes away:
* ``watch`` is a long-lived process fed one line per heartbeat by the controller; each line renews
  the heartbeat file. When the controller process dies its kernel closes the connection, so
  ``watch`` reads EOF: unless a newer heartbeat arrives within ``WATCH_EOF_GRACE`` seconds (a
  reconnected controller), it tells the agent to stop (SIGUSR1). A network cut gives no EOF (or
  one long after the last line, when sshd gives up on the client): the heartbeat timeout governs.
* the agent's watchdog stops everything when the heartbeat file has not changed for
  ``heartbeat_timeout`` seconds or ``max_duration`` has passed.
Every child is started in its own session and only signalled after checking that its pid still has
the start time recorded for it.

Timed waits use select() rather than time.sleep()/Event.wait(): libfaketime (used in the tests to
shift this host's clock) breaks clock_nanosleep and timed condition waits.
"""

import hashlib
import json
import os
import platform
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

AGENT_VERSION = 2
# The agent directory: every file name is typed here once (agents/host.py imports them).
SCRIPT_FILE = "remote.py"
CONFIG_FILE = "agent.json"
PREFLIGHT_FILE = "preflight.json"
PID_FILE = "agent.pid"
STATUS_FILE = "status.json"
MANIFEST_FILE = "MANIFEST.json"
HEARTBEAT_FILE = "heartbeat"
LOG_FILE = "agent.log"
NOT_IN_MANIFEST = (MANIFEST_FILE, HEARTBEAT_FILE, PID_FILE)
#: Files the controller does not copy home.
NOT_FETCHED = frozenset({SCRIPT_FILE, HEARTBEAT_FILE, PID_FILE})
#: Files rewritten in place (not append-only): fetched whole whenever they change.
REWRITTEN = frozenset({STATUS_FILE, MANIFEST_FILE, CONFIG_FILE, PREFLIGHT_FILE})
WATCH_BYE = b"bye"  # the controller's last line on the watch channel: a clean goodbye, not a death

START_WAIT = 15.0  # seconds `start` waits for the daemon to report ready
START_SETTLE = 0.3  # seconds after starting commands before checking none died at once
LOOP_PERIOD = 0.25  # watchdog period
STATUS_PERIOD = 2.0  # status.json rewrite period
STOP_GRACE = 2.0  # seconds between SIGINT, SIGTERM and SIGKILL of a collector
STOP_WAIT = 20.0  # seconds `stop` waits for the agent to exit before killing it
CHECK_TIMEOUT = 8.0  # seconds for one tool version check in preflight
ECHO_IDLE_TIMEOUT = 300.0  # the echo process exits after this long without a line
WATCH_EOF_GRACE = 5.0  # seconds after the watch channel's EOF before the agent is told to stop
WATCH_EOF_MAX_SILENCE = 12.0  # an EOF this long after the last line is a dead link, not a dead controller
WATCH_POLL = 1.0  # seconds between the watch process's checks that the agent still runs
MAX_DURATION_CAP = 7 * 24 * 3600.0
MAX_TASKS = 4096  # threads of the monitored process read per procfs sample
PROMETHEUS_MAX_BYTES = 8 << 20
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)  # pidstat prints its last lines on SIGINT


def _sleep(seconds: float) -> None:
    if seconds > 0:
        select.select([], [], [], seconds)


def _now() -> float:
    return time.time()


def _log(msg: str) -> None:
    sys.stderr.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {msg}\n")
    sys.stderr.flush()


def _write_text_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _write_json_atomic(path: str, obj: object) -> None:
    _write_text_atomic(path, json.dumps(obj, indent=1, sort_keys=True))


def _read_json(path: str) -> "dict | None":
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _read_text(path: str) -> str:
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace")


# -- /proc/PID/stat, read in one place -----------------------------------------------------------
class Stat:
    """/proc/PID/stat (or /proc/PID/task/TID/stat) split once. ``field(n)`` is man proc(5)'s
    field number n (1-based: 3 state, 4 ppid, 5 pgrp, 10 minflt, 12 majflt, 14 utime, 15 stime,
    20 num_threads, 22 starttime, 23 vsize, 24 rss, 39 processor)."""

    def __init__(self, text: str):
        self.comm = text[text.find("(") + 1 : text.rfind(")")]
        self._rest = text[text.rfind(")") + 2 :].split()  # from field 3 (state) on

    def field(self, n: int) -> str:
        return self._rest[n - 3]

    def int(self, n: int) -> int:
        return int(self._rest[n - 3])

    @property
    def zombie(self) -> bool:
        return self.field(3) == "Z"


def _stat(path: str) -> "Stat | None":
    """Stat of a /proc/.../stat file, None when it is gone or unreadable."""
    try:
        st = Stat(_read_text(path))
        st.field(3)
        return st
    except (OSError, IndexError):
        return None


def _proc_start_time(pid: int) -> "int | None":
    """Start time of ``pid`` in clock ticks since boot (field 22), None if gone or a zombie."""
    st = _stat(f"/proc/{pid}/stat")
    try:
        return None if st is None or st.zombie else st.int(22)
    except (IndexError, ValueError):
        return None


def _ppid(pid: int) -> "int | None":
    st = _stat(f"/proc/{pid}/stat")
    try:
        return None if st is None else st.int(4)
    except (IndexError, ValueError):
        return None


def _is_ours(pid: "int | None", start_time: "int | None") -> bool:
    return bool(pid) and start_time is not None and _proc_start_time(pid) == start_time


def _signal_group(pid: int, start_time: "int | None", sig: int) -> bool:
    """Signal the process group led by ``pid`` (started with setsid) if it is still ours."""
    if not _is_ours(pid, start_time):
        return False
    try:
        os.killpg(pid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        try:
            os.kill(pid, sig)
            return True
        except OSError:
            return False


def stop_groups(groups: "list[tuple[int, int | None]]", grace: float = STOP_GRACE) -> None:
    """SIGINT, then SIGTERM, then SIGKILL each (pid, start time) process group still ours, waiting
    up to ``grace`` seconds after each signal; then SIGKILL anything left in those groups."""
    pending = [(p, s) for p, s in groups if _is_ours(p, s)]
    for sig in STOP_SIGNALS:
        if not pending:
            break
        for pid, start in pending:
            _signal_group(pid, start, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_is_ours(p, s) for p, s in pending):
            _sleep(0.05)
        pending = [(p, s) for p, s in pending if _is_ours(p, s)]
    for pid, _ in groups:  # leftovers in a collector's own process group (a child it forked)
        for member in _group_members(pid):
            if member != os.getpid():
                try:
                    os.kill(member, signal.SIGKILL)
                except OSError:
                    pass


def _group_members(pgid: int) -> "list[int]":
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = _stat(f"/proc/{name}/stat")
        try:
            if st is not None and not st.zombie and st.int(5) == pgid:
                out.append(int(name))
        except (IndexError, ValueError):
            continue
    return out


def _child_setup():
    """A preexec_fn for collectors: SIGINT back to default (a controller started as a background
    job in a script has it ignored, and an ignored signal is inherited), and SIGTERM to the child
    when the agent dies (Linux prctl PR_SET_PDEATHSIG, where ctypes can reach it)."""
    prctl = None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except Exception:
        pass

    def _set() -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        if prctl is not None:
            prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    return _set


# -- samplers --------------------------------------------------------------------------------
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
                    t = _now()
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
                        _sleep(min(left, LOOP_PERIOD))
        except Exception as e:
            self.error = f"{type(e).__name__}: {e}"
            _log(f"sampler {self.cname} failed: {self.error}")
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


class ProcfsSampler(Sampler):
    """Cumulative counters of one process and its threads from /proc (collectors/procfs.py)."""

    def __init__(self, name, path, interval, stopping, pid: int):
        super().__init__(name, path, interval, stopping)
        self.pid = int(pid)
        self.clk_tck = os.sysconf("SC_CLK_TCK")
        self.ncpu = os.cpu_count() or 1
        self.page_kb = os.sysconf("SC_PAGE_SIZE") // 1024
        self._gone_reported = False

    def _tasks(self, base: str) -> "tuple[list[list], int, int, int]":
        """Per-thread rows [tid, comm, utime, stime, processor, vol cs, invol cs] and the summed
        voluntary / involuntary switches and run-queue wait (ns)."""
        vol = invol = wait_ns = 0
        tasks = []
        try:
            tids = sorted(int(x) for x in os.listdir(f"{base}/task") if x.isdigit())[:MAX_TASKS]
        except OSError:
            tids = []
        for tid in tids:
            tb = f"{base}/task/{tid}"
            st = _stat(f"{tb}/stat")
            try:
                ts = _status_nums(_read_text(f"{tb}/status"))
            except OSError:
                continue  # the thread exited between listdir and read
            v, nv = ts.get("voluntary_ctxt_switches", 0), ts.get("nonvoluntary_ctxt_switches", 0)
            vol += v
            invol += nv
            try:
                wait_ns += int(_read_text(f"{tb}/schedstat").split()[1])
            except (OSError, IndexError, ValueError):
                pass
            try:
                if st is not None:
                    tasks.append([tid, st.comm, st.int(14), st.int(15), st.int(39), v, nv])
            except (IndexError, ValueError):
                pass
        return tasks, vol, invol, wait_ns

    def sample(self, t: float) -> "list[dict]":
        base = f"/proc/{self.pid}"
        st = _stat(f"{base}/stat")
        try:
            if st is None:
                raise FileNotFoundError(2, "No such process")
            status = _status_nums(_read_text(f"{base}/status"))
        except OSError as e:
            if self._gone_reported:
                return []
            self._gone_reported = True
            return [{"t": round(t, 3), "pid": self.pid, "error": f"process gone ({e.strerror})"}]
        tasks, vol, invol, wait_ns = self._tasks(base)
        return [{
            "t": round(t, 3), "pid": self.pid, "utime": st.int(14), "stime": st.int(15),
            "clk_tck": self.clk_tck,
            "rss_kb": status.get("VmRSS", st.int(24) * self.page_kb),
            "vsz_kb": status.get("VmSize", st.int(23) // 1024),
            "threads": status.get("Threads", st.int(20)),
            "vol_cs": vol if tasks else status.get("voluntary_ctxt_switches"),
            "invol_cs": invol if tasks else status.get("nonvoluntary_ctxt_switches"),
            "minflt": st.int(10), "majflt": st.int(12), "ncpu": self.ncpu, "wait_ns": wait_ns,
            "tasks": tasks,
        }]


class PrometheusSampler(Sampler):
    """Scrapes a /metrics URL (Prometheus text) with urllib; one JSON line per scrape.  ``tls``
    (the plan's [endpoint] as agents/settings.py passes it): ``verify`` false checks no
    certificate, ``cadata`` is the PEM text of the CAs to trust, ``headers`` go on each scrape."""

    def __init__(self, name, path, interval, stopping, url: str, tls: dict = None):
        super().__init__(name, path, interval, stopping)
        self.url = url
        tls = tls or {}
        self.headers = dict(tls.get("headers") or {})
        self.context = None
        if url.startswith("https://") and (tls.get("cadata") or tls.get("verify") is False):
            import ssl

            self.context = ssl.create_default_context(cadata=tls.get("cadata") or None)
            if tls.get("verify") is False:
                self.context.check_hostname = False
                self.context.verify_mode = ssl.CERT_NONE

    def sample(self, t: float) -> "list[dict]":
        import urllib.request

        try:
            req = urllib.request.Request(self.url, headers=self.headers)
            with urllib.request.urlopen(req, timeout=max(0.5, self.interval * 0.8), context=self.context) as r:
                text = r.read(PROMETHEUS_MAX_BYTES).decode("utf-8", "replace")
            return [{"t": round(t, 3), "url": self.url, "text": text}]
        except Exception as e:
            return [{"t": round(t, 3), "url": self.url, "error": f"{type(e).__name__}: {e}"}]


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
        self.last_t = None

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


# -- cgroup: the monitored process's limits and throttling (collectors/cgroup.py) ------------------
# Written for Python 3.6 as well: no annotations, no walrus, no dataclasses.
CGROUP_UNLIMITED = 1 << 62  # v1's "no memory limit" is PAGE_COUNTER_MAX x page size (~2^63)
CGROUP_FS_VERSION = {"cgroup": 1, "cgroup2": 2}  # mountinfo file system type -> cgroup version


def _unescape_mount(path):
    """A mountinfo path with its octal escapes (\\040 for a space) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def cgroup_mounts(mountinfo):
    """{controller: (mount root, mount point)} of the cgroup v1 mounts in a mountinfo text, with
    "" for the cgroup2 (unified) mount; the first mount of each wins."""
    out = {}
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        root, point = _unescape_mount(fields[3]), _unescape_mount(fields[4])
        version = CGROUP_FS_VERSION.get(tail[0])
        if version == 2:
            out.setdefault("", (root, point))
        elif version == 1:
            for opt in tail[2].split(","):
                if opt not in ("rw", "ro") and "=" not in opt:
                    out.setdefault(opt, (root, point))
    return out


def cgroup_paths(text):
    """{controller: cgroup path} from /proc/PID/cgroup ("" for the v2 line "0::/path")."""
    out = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            out.setdefault("", parts[2])
        for c in parts[1].split(","):
            if c and "=" not in c:
                out.setdefault(c, parts[2])
    return out


def cgroup_dir(mounts, paths, controller, v2_file):
    """(version, directory) of ``controller`` for the process: its v1 hierarchy where one is
    mounted, else the unified (v2) one where ``v2_file`` exists there; (None, None) otherwise."""
    for key, version in ((controller, 1), ("", 2)):
        if key not in mounts or key not in paths:
            continue
        root, point = mounts[key]
        path = paths[key]
        rel = os.path.relpath(path, root) if (path + "/").startswith(root.rstrip("/") + "/") else "."
        d = os.path.normpath(os.path.join(point, rel))
        if version == 1 or os.path.exists(os.path.join(d, v2_file)):
            return version, d
    return None, None


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
            return _read_text(os.path.join(d, n)).strip()
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
        self.fast = None  # (version, directory, reads cpuacct.usage) of the counters, between full samples
        self.k = 0
        self.mounts = {}
        self.mountinfo_file = "/proc/self/mountinfo"
        self.cgroup_file = "/proc/%d/cgroup" % self.pid
        self._gone_reported = False

    def setup(self):
        try:
            self.mounts = cgroup_mounts(_read_text(self.mountinfo_file))
        except OSError:
            self.mounts = {}
        if self.throttle_interval and float(self.throttle_interval) < self.interval:
            probe = {}
            try:
                self.read(cgroup_paths(_read_text(self.cgroup_file)), probe)
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
        elif version == 1 and acct:  # present where cpuacct is mounted with cpu (the usual "cpu,cpuacct")
            row["usage_ns"] = _int_or_none(_read_first(stat_dir, ["cpuacct.usage"]))

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
        acct = version == 1 and os.path.exists(os.path.join(stat_dir, "cpuacct.usage"))
        self._counters(version, stat_dir, acct, row)
        self.fast = (version, stat_dir, acct)

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
            paths = cgroup_paths(_read_text(self.cgroup_file))
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


#: The samplers this agent implements, by the name a collector's ``sampler`` gives.
SAMPLERS: "dict[str, type[Sampler]]" = {"procfs": ProcfsSampler, "nvml": NvmlSampler, "prometheus": PrometheusSampler,
                                        "cgroup": CgroupSampler}


# -- the agent daemon ------------------------------------------------------------------------
class Agent:
    def __init__(self, run_dir: str, cfg: dict):
        self.dir = run_dir
        self.cfg = cfg
        self.interval = float(cfg.get("interval", 1.0))
        self.heartbeat_timeout = float(cfg.get("heartbeat_timeout", 30.0))
        self.max_duration = min(float(cfg.get("max_duration", 3600.0)), MAX_DURATION_CAP)
        self.stopping = threading.Event()
        self.reason: str | None = None
        self.commands: dict[str, dict] = {}
        self.samplers: dict[str, Sampler] = {}
        self.sampler_errors: dict[str, str] = {}
        self.started = _now()
        self.my_start = _proc_start_time(os.getpid())

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def _on_signal(self, signum, frame) -> None:
        if self.reason is None:
            if signum == signal.SIGUSR1:
                self.reason = "controller gone (its watch channel closed)"
            else:
                self.reason = f"signal {signal.Signals(signum).name}"
        self.stopping.set()

    # status.json ----------------------------------------------------------------------------
    def _command_status(self, c: dict) -> dict:
        p = c.get("proc")
        rc = p.poll() if p is not None else c.get("exit_code")
        if p is not None:
            c["exit_code"] = rc
        return {"kind": "command", "argv": c["argv"], "raw_file": c["raw_file"], "pid": c.get("pid"),
                "start_time": c.get("start_time"), "running": p is not None and rc is None, "exit_code": rc,
                "error": c.get("error"), "bytes": _size(self.path(c["raw_file"]))}

    def snapshot(self, state: str) -> dict:
        col = {name: self._command_status(c) for name, c in self.commands.items()}
        for name, s in self.samplers.items():
            col[name] = {"kind": "sampler", "raw_file": os.path.basename(s.path), "running": s.is_alive(),
                         "error": s.error, "lines": s.lines, "bytes": _size(s.path)}
        for name, err in self.sampler_errors.items():
            col.setdefault(name, {"kind": "sampler", "running": False, "error": err, "bytes": 0})
        return {"agent_version": AGENT_VERSION, "agent_pid": os.getpid(), "agent_start_time": self.my_start,
                "state": state, "reason": self.reason, "started": self.started, "updated": _now(),
                "collectors": col}

    def write_status(self, state: str) -> dict:
        st = self.snapshot(state)
        _write_json_atomic(self.path(STATUS_FILE), st)
        return st

    # collectors -----------------------------------------------------------------------------
    def start_command(self, spec: dict, preexec) -> None:
        name, raw = spec["name"], spec["raw_file"]
        c = {"argv": list(spec["argv"]), "raw_file": raw}
        self.commands[name] = c
        env = dict(os.environ)
        env.update({str(k): str(v) for k, v in (spec.get("env") or {}).items()})
        try:
            with open(self.path(raw), "ab") as out, open(self.path(f"{name}.err"), "ab") as err:
                p = subprocess.Popen(c["argv"], stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                                     cwd=self.dir, start_new_session=True, preexec_fn=preexec)
        except OSError as e:
            c["error"] = f"cannot start {c['argv'][0]}: {e.strerror or e}"
            c["exit_code"] = 127
            _log(f"{name}: {c['error']}")
            return
        c.update(proc=p, pid=p.pid, start_time=_proc_start_time(p.pid))
        _log(f"{name}: started pid {p.pid}: {' '.join(c['argv'])}")

    def start_sampler(self, spec: dict) -> None:
        name = spec["name"]
        cls = SAMPLERS.get(spec["sampler"])
        if cls is None:
            self.sampler_errors[name] = f"unknown sampler {spec['sampler']!r} (this agent has {', '.join(SAMPLERS)})"
            return
        try:
            s = cls(name, self.path(spec["raw_file"]), float(spec.get("interval", self.interval)), self.stopping,
                    **(spec.get("params") or {}))
            s.setup()
        except Exception as e:
            self.sampler_errors[name] = f"{type(e).__name__}: {e}"
            _log(f"{name}: not started: {self.sampler_errors[name]}")
            return
        self.samplers[name] = s
        s.start()
        _log(f"{name}: sampler started")

    def start_collectors(self) -> None:
        preexec = _child_setup()
        for spec in self.cfg.get("collectors", []):
            if spec.get("argv") is not None:
                self.start_command(spec, preexec)
            else:
                self.start_sampler(spec)

    def stop_collectors(self) -> None:
        self.stopping.set()
        live = [c for c in self.commands.values() if c.get("proc") is not None]
        stop_groups([(c["pid"], c["start_time"]) for c in live])
        for c in live:
            c["exit_code"] = c["proc"].poll()
        deadline = time.monotonic() + STOP_GRACE
        while time.monotonic() < deadline and any(s.is_alive() for s in self.samplers.values()):
            _sleep(0.05)

    # the watchdog ---------------------------------------------------------------------------
    def _why_stop(self, t0: float, beat_at: float, now: float) -> "str | None":
        if now - beat_at > self.heartbeat_timeout:
            return f"heartbeat lost ({now - beat_at:.1f}s > {self.heartbeat_timeout:g}s)"
        if now - t0 > self.max_duration:
            return f"max_duration ({self.max_duration:g}s) reached"
        return None

    def watch(self) -> None:
        """Until stopped: follow the heartbeat file, rewrite status.json now and then."""
        t0 = time.monotonic()
        beat_key, beat_at = _file_key(self.path(HEARTBEAT_FILE)), t0
        last_status = t0
        while not self.stopping.is_set():
            _sleep(LOOP_PERIOD)
            now = time.monotonic()
            key = _file_key(self.path(HEARTBEAT_FILE))
            if key != beat_key:
                beat_key, beat_at = key, now
            self.reason = self.reason or self._why_stop(t0, beat_at, now)
            if self.reason:
                break
            if now - last_status >= STATUS_PERIOD:
                self.write_status("running")
                last_status = now

    def run(self, ready_fd: "int | None") -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(sig, self._on_signal)
        _write_text_atomic(self.path(PID_FILE), f"{os.getpid()} {self.my_start}\n")
        _touch(self.path(HEARTBEAT_FILE))
        try:
            self.start_collectors()
            _sleep(START_SETTLE)
            st = self.write_status("running")
            ready_fd = _report(ready_fd, {"ok": True, "status": st})
            self.watch()
        except Exception as e:
            self.reason = self.reason or f"agent error: {type(e).__name__}: {e}"
            _log(traceback.format_exc())
            ready_fd = _report(ready_fd, {"ok": False, "error": self.reason})
        finally:
            self.reason = self.reason or "stopped"
            _log(f"stopping: {self.reason}")
            self.stop_collectors()
            self.write_status("stopped")
            write_manifest(self.dir)
            _unlink(self.path(PID_FILE))
            _log("stopped")
        return 0


def _report(fd: "int | None", msg: dict) -> None:  # returns None: the fd is closed
    """Send ``start`` its one-line answer through the ready pipe (once)."""
    if fd is not None:
        os.write(fd, json.dumps(msg).encode() + b"\n")
        os.close(fd)
    return None


def _size(path: "str | None") -> int:
    try:
        return os.path.getsize(path) if path else 0
    except OSError:
        return 0


def _file_key(path: str):
    """What changes whenever ``path`` is rewritten (inode, mtime, size); None when missing. Not
    the mtime alone: under libfaketime the process clock and the file times disagree."""
    try:
        st = os.stat(path)
        return (st.st_ino, st.st_mtime_ns, st.st_size)
    except OSError:
        return None


def _touch(path: str) -> None:
    _write_text_atomic(path, f"{_now()!r}\n")


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def write_manifest(run_dir: str) -> dict:
    files = {}
    for name in sorted(os.listdir(run_dir)):
        path = os.path.join(run_dir, name)
        if name in NOT_IN_MANIFEST or ".tmp" in name or not os.path.isfile(path):
            continue
        h = hashlib.sha256()
        size = 0
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
                size += len(chunk)
        files[name] = {"sha256": h.hexdigest(), "size": size}
    manifest = {"written": _now(), "files": files}
    _write_json_atomic(os.path.join(run_dir, MANIFEST_FILE), manifest)
    return manifest


def _read_pidfile(run_dir: str) -> "tuple[int | None, int | None]":
    try:
        with open(os.path.join(run_dir, PID_FILE)) as f:
            parts = f.read().split()
        return int(parts[0]), int(parts[1])
    except (OSError, ValueError, IndexError):
        return None, None


def _agent_alive(run_dir: str) -> "tuple[bool, int | None, int | None]":
    pid, start = _read_pidfile(run_dir)
    return _is_ours(pid, start), pid, start


# -- verbs -----------------------------------------------------------------------------------
def _fail(msg: str, code: int = 2) -> int:
    print(json.dumps({"ok": False, "error": msg}))
    return code


def _daemon(run_dir: str, cfg: dict, w: int) -> None:
    """The forked child of ``start``: detach, log to agent.log, run the agent; never returns."""
    code = 1
    try:
        os.setsid()
        os.chdir(run_dir)
        devnull = os.open(os.devnull, os.O_RDWR)
        log = os.open(os.path.join(run_dir, LOG_FILE), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        for fd, src in ((0, devnull), (1, log), (2, log)):
            os.dup2(src, fd)
        os.close(devnull)
        os.close(log)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        _log(f"agent {AGENT_VERSION} pid {os.getpid()} python {platform.python_version()} in {run_dir}")
        code = Agent(run_dir, cfg).run(w)
    except BaseException:
        try:
            _log(traceback.format_exc())
        except Exception:
            pass
    finally:
        os._exit(code)


def _read_message(fd: int, timeout: float) -> bytes:
    """One newline-terminated message from ``fd`` within ``timeout`` (b"" if none came)."""
    buf = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
        if buf.endswith(b"\n"):
            break
    return buf


def cmd_start(cfg_path: str) -> int:
    cfg_path = os.path.abspath(cfg_path)
    run_dir = os.path.dirname(cfg_path)
    cfg = _read_json(cfg_path)
    if not isinstance(cfg, dict):
        return _fail(f"{cfg_path}: not a readable JSON object")
    alive, pid, _ = _agent_alive(run_dir)
    if alive:
        return _fail(f"an agent (pid {pid}) is already running in {run_dir}")
    _unlink(os.path.join(run_dir, MANIFEST_FILE))
    r, w = os.pipe()
    if os.fork() == 0:
        os.close(r)
        _daemon(run_dir, cfg, w)
    os.close(w)
    buf = _read_message(r, START_WAIT)
    os.close(r)
    try:
        msg = json.loads(buf.decode())
    except ValueError:
        tail = ""
        try:
            with open(os.path.join(run_dir, LOG_FILE)) as f:
                tail = f.read()[-300:].strip().splitlines()[-1:]
        except OSError:
            pass
        return _fail(f"agent did not report ready within {START_WAIT:g}s {tail}")
    print(json.dumps(msg))
    return 0 if msg.get("ok") else 1


def cmd_stop(run_dir: str) -> int:
    run_dir = os.path.abspath(run_dir)
    killed = []
    alive, pid, start = _agent_alive(run_dir)
    if alive:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT
        while time.monotonic() < deadline and _is_ours(pid, start):
            _sleep(0.05)
        if _is_ours(pid, start):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            _sleep(0.1)
    # whatever the agent left behind (it was killed, or died): collectors still ours
    st = _read_json(os.path.join(run_dir, STATUS_FILE)) or {}
    groups = [(c.get("pid"), c.get("start_time")) for c in (st.get("collectors") or {}).values() if c.get("pid")]
    left = [p for p, s in groups if _is_ours(p, s)]
    stop_groups(groups)
    killed += left
    _unlink(os.path.join(run_dir, PID_FILE))
    st = _read_json(os.path.join(run_dir, STATUS_FILE)) or {}
    manifest = write_manifest(run_dir)
    print(json.dumps({"ok": True, "reason": st.get("reason"), "status": st, "killed": killed, "manifest": manifest}))
    return 0


def _read_lines(fd: int, timeout: float) -> "list[bytes] | None":
    """Complete lines read from ``fd`` within ``timeout`` ([] if none); None at EOF."""
    ready, _, _ = select.select([fd], [], [], timeout)
    if not ready:
        return []
    chunk = os.read(fd, 4096)
    if not chunk:
        return None
    return chunk.splitlines()


def _controller_gone(run_dir: str, silent_for: float) -> int:
    """After the watch channel's EOF: tell the agent to stop unless a newer heartbeat comes."""
    if silent_for > WATCH_EOF_MAX_SILENCE:
        _log(f"watch: EOF {silent_for:.1f}s after the last line (a dead link): the heartbeat timeout governs")
        return 0
    beat = _file_key(os.path.join(run_dir, HEARTBEAT_FILE))
    deadline = time.monotonic() + WATCH_EOF_GRACE
    while time.monotonic() < deadline:
        _sleep(0.1)
        if _file_key(os.path.join(run_dir, HEARTBEAT_FILE)) != beat:
            return 0  # a reconnected controller renews the heartbeat through a new watch
    alive, pid, _ = _agent_alive(run_dir)
    if alive:
        os.kill(pid, signal.SIGUSR1)
    return 0


def cmd_watch(run_dir: str) -> int:
    """The controller's heartbeat channel: each line on stdin renews the heartbeat and is
    answered "ok"; "bye" ends it quietly; EOF (the controller died) stops the agent."""
    run_dir = os.path.abspath(run_dir)
    beat_path = os.path.join(run_dir, HEARTBEAT_FILE)
    last_line = time.monotonic()
    while True:
        lines = _read_lines(0, WATCH_POLL)
        if lines is None:
            return _controller_gone(run_dir, time.monotonic() - last_line)
        if not _agent_alive(run_dir)[0]:
            return 0
        for line in lines:
            if line.strip() == WATCH_BYE:
                return 0
            _touch(beat_path)
            last_line = time.monotonic()
            try:
                os.write(1, b"ok\n")
            except OSError:
                pass


def cmd_echo() -> int:
    """Answer each line on stdin with 'T2 T3' (receive and send time, epoch seconds)."""
    buf = b""
    while True:
        ready, _, _ = select.select([0], [], [], ECHO_IDLE_TIMEOUT)
        if not ready:
            return 0
        t2 = _now()
        chunk = os.read(0, 4096)
        if not chunk:
            return 0
        buf += chunk
        while b"\n" in buf:
            _, buf = buf.split(b"\n", 1)
            t3 = _now()
            os.write(1, f"{t2!r} {t3!r}\n".encode())


# -- preflight ---------------------------------------------------------------------------------
def _run_capture(argv: "list[str]", timeout: float) -> "tuple[int | None, str]":
    """Run argv with stdout+stderr captured, bounded by ``timeout`` (killed after it).

    Written with select() and poll() rather than subprocess.run(timeout=...), which sleeps with
    clock_nanosleep (broken under libfaketime). Returns (exit code or None on timeout, text)."""
    p = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=dict(os.environ, LC_ALL="C"), start_new_session=True,
    )
    out = b""
    deadline = time.monotonic() + timeout
    fd = p.stdout.fileno()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        if len(out) < 1 << 20:
            out += chunk
    while p.poll() is None and time.monotonic() < deadline:
        _sleep(0.02)
    rc = p.poll()
    if rc is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        while p.poll() is None:
            _sleep(0.02)
    p.stdout.close()
    return rc, out.decode("utf-8", "replace")


def _run_check(argv: "list[str]") -> dict:
    path = shutil.which(argv[0])
    if path is None:
        return {"found": False, "error": f"{argv[0]}: not found on PATH"}
    try:
        rc, out = _run_capture(argv, CHECK_TIMEOUT)
    except OSError as e:
        return {"found": True, "path": path, "error": f"{' '.join(argv)}: {e.strerror or e}"}
    if rc is None:
        return {"found": True, "path": path, "error": f"{' '.join(argv)}: no answer in {CHECK_TIMEOUT:g}s"}
    return {"found": True, "path": path, "rc": rc, "output": out[:4000]}


def _cpu_topology() -> dict:
    topo: dict = {"logical_cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        text = ""
    procs = [b for b in text.split("\n\n") if b.strip().startswith("processor") or "processor" in b]
    sockets, cores = set(), set()
    model = None
    for block in procs:
        kv = {}
        for line in block.splitlines():
            k, _, v = line.partition(":")
            kv[k.strip()] = v.strip()
        model = model or kv.get("model name") or kv.get("Model") or kv.get("cpu model")
        if "physical id" in kv:
            sockets.add(kv["physical id"])
            cores.add((kv["physical id"], kv.get("core id", kv.get("processor"))))
    if procs:
        topo["logical_cpus"] = len(procs)
    if sockets:
        topo["sockets"] = len(sockets)
        topo["physical_cores"] = len(cores)
    if shutil.which("lscpu"):
        try:
            out = _run_capture(["lscpu"], CHECK_TIMEOUT)[1]
            kv = {}
            for line in out.splitlines():
                k, _, v = line.partition(":")
                kv[k.strip()] = v.strip()

            def i(key):
                try:
                    return int(kv[key])
                except (KeyError, ValueError):
                    return None

            s, cps, tpc, n = i("Socket(s)"), i("Core(s) per socket"), i("Thread(s) per core"), i("CPU(s)")
            if s and cps:
                topo.setdefault("sockets", s)
                topo.setdefault("physical_cores", s * cps)
            if tpc:
                topo["threads_per_core"] = tpc
            if n:
                topo["logical_cpus"] = n
            model = model or kv.get("Model name")
            topo["source"] = "lscpu+cpuinfo"
        except OSError:
            pass
    if "threads_per_core" not in topo and topo.get("physical_cores"):
        topo["threads_per_core"] = max(1, topo["logical_cpus"] // topo["physical_cores"])
    topo["model"] = model
    return topo


def _memory_total_kb() -> "int | None":
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _gpus() -> "tuple[list[dict], dict]":
    gpus: list[dict] = []
    nvml: dict = {"available": False}
    if shutil.which("nvidia-smi"):
        try:
            rc, out = _run_capture(
                ["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version", "--format=csv,noheader,nounits"],
                CHECK_TIMEOUT * 2,
            )
            for line in out.splitlines():
                parts = [x.strip() for x in line.split(",")]
                if len(parts) == 4 and parts[0].isdigit():
                    gpus.append({"index": int(parts[0]), "name": parts[1], "memory_total_mb": _num(parts[2]),
                                 "driver": parts[3]})
        except OSError:
            pass
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            drv = pynvml.nvmlSystemGetDriverVersion()
            nvml = {"available": True, "driver": drv.decode() if isinstance(drv, bytes) else drv,
                    "count": pynvml.nvmlDeviceGetCount()}
            if not gpus:
                for i in range(nvml["count"]):
                    h = pynvml.nvmlDeviceGetHandleByIndex(i)
                    name = pynvml.nvmlDeviceGetName(h)
                    gpus.append({"index": i, "name": name.decode() if isinstance(name, bytes) else name,
                                 "memory_total_mb": pynvml.nvmlDeviceGetMemoryInfo(h).total // (1 << 20),
                                 "driver": nvml["driver"]})
        finally:
            pynvml.nvmlShutdown()
    except ImportError:
        nvml = {"available": False, "error": "pynvml is not importable"}
    except Exception as e:
        nvml = {"available": False, "error": f"{type(e).__name__}: {e}"}
    return gpus, nvml


def _num(text: str):
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return None


def _cmdline(pid: int) -> "str | None":
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return None


def _ancestors() -> "set[int]":
    out, pid = set(), os.getpid()
    while pid and pid not in out:
        out.add(pid)
        pid = _ppid(pid) or 0
    return out


def _pick_root(pids: "list[int]", what: str) -> "tuple[int | None, str | None]":
    """One process out of several: the one whose parent is not also a candidate."""
    if not pids:
        return None, f"no process {what}"
    cand = set(pids)
    roots = sorted(p for p in pids if _ppid(p) not in cand)
    if len(roots) == 1:
        return roots[0], None
    shown = ", ".join(f"{p} ({(_cmdline(p) or '')[:60]})" for p in roots[:5])
    return None, f"{len(roots)} unrelated processes {what}: {shown}; give pid = ... to choose one"


def _listening_inodes(port: int) -> "set[str]":
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)
                for line in f:
                    parts = line.split()
                    if len(parts) < 10 or parts[3] != "0A":  # 0A = LISTEN
                        continue
                    if int(parts[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(parts[9])
        except (OSError, ValueError):
            continue
    return inodes


def resolve_process(pid=None, process=None, port=None) -> dict:
    if pid is not None:
        cmd = _cmdline(int(pid))
        if cmd is None:
            return {"error": f"no process with pid {pid}"}
        return {"pid": int(pid), "cmdline": cmd, "by": "pid"}
    me = _ancestors()
    if process is not None:
        try:
            rx = re.compile(process)
        except re.error as e:
            return {"error": f"process regex {process!r} is invalid: {e}"}
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) in me:
                continue
            cmd = _cmdline(int(name))
            if cmd and "remote.py" not in cmd and rx.search(cmd):
                found.append(int(name))
        got, err = _pick_root(found, f"matching {process!r}")
        if err:
            return {"error": err, "candidates": sorted(found)}
        return {"pid": got, "cmdline": _cmdline(got), "by": "process", "candidates": sorted(found)}
    if port is not None:
        inodes = _listening_inodes(int(port))
        if not inodes:
            return {"error": f"nothing listens on TCP port {port}"}
        targets = {f"socket:[{i}]" for i in inodes}
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            fd_dir = f"/proc/{name}/fd"
            try:
                for fd in os.listdir(fd_dir):
                    try:
                        if os.readlink(f"{fd_dir}/{fd}") in targets:
                            found.append(int(name))
                            break
                    except OSError:
                        continue
            except OSError:
                continue
        got, err = _pick_root(found, f"listening on TCP port {port}")
        if err:
            if not found:
                err = f"TCP port {port} is listening but its process is not visible (run as its user or root)"
            return {"error": err, "candidates": sorted(found)}
        return {"pid": got, "cmdline": _cmdline(got), "by": "port", "candidates": sorted(found)}
    return {"pid": None, "by": None}


def cmd_preflight(arg: "str | None") -> int:
    cfg: dict = {}
    if arg:
        cfg = json.loads(arg) if arg.lstrip().startswith("{") else (_read_json(arg) or {})
    gpus, nvml = _gpus() if cfg.get("gpus", True) else ([], {"available": False})
    facts = {
        "ok": True,
        "agent_version": AGENT_VERSION,
        "python": platform.python_version(),
        "hostname": socket.gethostname(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "time": _now(),
        "tools": {name: _run_check(list(argv)) for name, argv in (cfg.get("checks") or {}).items() if argv},
        "cpu": _cpu_topology(),
        "memory_total_kb": _memory_total_kb(),
        "gpus": gpus,
        "nvml": nvml,
        "procfs": os.path.isdir("/proc/self"),
        "process": resolve_process(cfg.get("pid"), cfg.get("process"), cfg.get("port")),
    }
    print(json.dumps(facts))
    return 0


def main(argv: "list[str]") -> int:
    usage = "usage: remote.py {preflight [CONFIG]|start CONFIG|watch DIR|stop DIR|echo}"
    if not argv:
        print(usage, file=sys.stderr)
        return 2
    verb, args = argv[0], argv[1:]
    try:
        if verb == "preflight":
            return cmd_preflight(args[0] if args else None)
        if verb == "echo":
            return cmd_echo()
        verbs = {"start": cmd_start, "watch": cmd_watch, "stop": cmd_stop}
        if verb in verbs and len(args) == 1:
            return verbs[verb](args[0])
    except KeyboardInterrupt:
        return 130
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The monitored service as a set of processes, found again at every sample.

``scope`` says which processes the service is:

* ``"tree"`` (the default): the process found (pid, port or regex) and every descendant of it.
  Workers fork, die and are replaced (a TorchServe worker restart, a gunicorn max-requests
  recycle), so the processes are listed again at each sample: a process whose parent is a member
  joins; a member stays one while it lives, even once its parent died and it was handed to init.
  The listing costs one ``listdir("/proc")`` and one stat read per process not seen before.
* ``"cgroup"``: every process of the found process's cgroup and of the groups below it (a
  container's or a pod's): the group's cgroup.procs files, read at each sample.
* ``"process"``: the found process alone (what was watched before the service was a tree).

The agent itself is never a member (in a container it may share the service's cgroup); its
collectors, where they share it, are: their cost is the agent's own (bench/agent_overhead.py).

The tree's counters (``Accounts``) are cumulative, as the kernel's are, and never fall when a
member leaves:

* CPU (utime, stime): each member's increase, counted from zero for a member born since the last
  sample, plus the increase of its reaped children's time (cutime, cstime: the kernel adds a
  child's whole time to its parent's when the parent reaps it, a zombie keeps its own until
  then).  That increase holds the whole life of a member that left, whose time up to its last
  sample was already counted: that part is taken away.  So a worker that dies between two samples
  leaves none of its CPU behind and none is counted twice; only a member reaped by a process
  outside the service (one handed to init) loses the time since its last sample.
* the others (page faults, disk bytes; context switches, run delay, block-IO delay of the
  threads): each member's (or thread's) increase, a new one counted from zero; what a member did
  after its last sample is lost (a sample's worth at most).

Roles, where they can be told (``role``): ``listener``, a member holding a listening TCP socket of
the service's port (of any port when it is not known) that its parent does not hold; ``worker``, a
member holding one its parent holds too (a pre-fork worker accepting on the inherited socket), or
any other member but the first; ``engine``, a member whose name says it runs the model
(ENGINE_MARKS).
"""

import os

from .cgroupfs import cgroup_mounts, cgroup_paths, group_dir
from .defaults import (DEFAULT_SCOPE, MAX_FDS_SCANNED, MAX_TREE_PROCESSES, SCOPE_CGROUP, SCOPE_PROCESS, SCOPE_TREE,
                       SCOPES)
from .files import read_text
from .processes import read_stat

#: Processes that run the model, by a piece of their name or command line: vLLM's engine core
#: ("VLLM::EngineCore"), SGLang's scheduler ("sglang::scheduler"), Text Generation Inference's
#: shards ("text-generation-server"), Triton's Python-backend stubs ("triton_python_backend_stub"),
#: Ray Serve's replicas ("ray::ServeReplica").
ENGINE_MARKS = ("EngineCore", "sglang::scheduler", "text-generation-server", "python_backend_stub",
                "ServeReplica")
#: The hierarchies a cgroup scope is read from, in order (v2's unified one first; in v1 the cpu
#: controller's, where a container's CPU limit is): the first that puts the process in a group
#: below its root, else the first mounted.
CGROUP_HIERARCHIES = ("", "cpu", "cpuacct", "pids", "memory", "cpuset", "blkio")
CMDLINE_MAX = 300  # characters of a member's command line kept
TCP_LISTEN = "0A"  # the state column of /proc/net/tcp for a listening socket

#: Cumulative counters of a member (its own and, where it has them, its reaped children's).
CPU_PAIRS = (("utime", "cutime"), ("stime", "cstime"))
PLAIN_COUNTERS = ("minflt", "majflt", "read_bytes", "write_bytes")
TASK_COUNTERS = ("vol_cs", "invol_cs", "wait_ns", "blkio_ticks")


def uptime_ticks(clk_tck):
    """Clock ticks since boot now (the unit of a process's start time), None where unreadable."""
    try:
        return int(float(read_text("/proc/uptime").split()[0]) * clk_tck)
    except (OSError, ValueError, IndexError):
        return None


def cmdline_of(pid):
    try:
        text = read_text("/proc/%d/cmdline" % pid)
    except OSError:
        return None
    return text.replace("\0", " ").strip()[:CMDLINE_MAX]


def listening_inodes(pid, port):
    """Socket inodes listening on TCP ``port`` (any port when None) in ``pid``'s network namespace."""
    out = set()
    for table in ("tcp", "tcp6"):
        try:
            text = read_text("/proc/%d/net/%s" % (pid, table))
        except OSError:
            continue
        for line in text.splitlines()[1:]:
            parts = line.split()
            if len(parts) < 10 or parts[3] != TCP_LISTEN:
                continue
            try:
                if port is None or int(parts[1].rsplit(":", 1)[1], 16) == int(port):
                    out.add(parts[9])
            except (ValueError, IndexError):
                continue
    return out


def socket_inodes(pid):
    """The socket inodes among ``pid``'s open files (the first MAX_FDS_SCANNED descriptors)."""
    out = set()  # type: set[str]
    base = "/proc/%d/fd" % pid
    try:
        fds = os.listdir(base)[:MAX_FDS_SCANNED]
    except OSError:
        return out
    for fd in fds:
        try:
            link = os.readlink(base + "/" + fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(link[8:-1])
    return out


class Member(object):
    """One process of the service: who it is (pid, start time, parent, name, role, command line)."""

    __slots__ = ("pid", "start", "ppid", "comm", "role", "cmdline")

    def __init__(self, pid, start, ppid, comm):
        self.pid, self.start, self.ppid, self.comm = pid, start, ppid, comm
        self.role = None
        self.cmdline = None


class Accounts(object):
    """A set's cumulative counters (``totals``) that never fall when one of it leaves: advanced by
    ``advance`` with each sample's {id: (start, parent, values)} (module docstring)."""

    def __init__(self, keys, pairs=()):
        self.keys, self.pairs = keys, pairs
        self.totals = {}
        self.last = None

    def advance(self, now, mark):
        """Add what the set did since the last call; ``mark``: the start time (clock ticks since
        boot) from which an id not seen before was born since then (counted from zero)."""
        last = self.last
        self.last = now
        if last is None:  # the first sample: the totals start at what the members hold
            for own, _ in self.pairs:
                self.totals[own] = sum(v[2].get(own) or 0 for v in now.values())
            for k in self.keys:
                self.totals[k] = sum(v[2].get(k) or 0 for v in now.values())
            return
        same = [i for i in now if i in last and now[i][0] == last[i][0]]
        born = [i for i in now if i not in last or now[i][0] != last[i][0]]
        born = [i for i in born if mark is not None and now[i][0] is not None and now[i][0] >= mark]
        for own, kids in self.pairs:
            self.totals[own] = self.totals.get(own, 0) + self._cpu(now, last, same, born, own, kids)
        for k in self.keys:
            d = sum(_rise(now[i][2].get(k), last[i][2].get(k)) for i in same)
            self.totals[k] = self.totals.get(k, 0) + d + sum(now[i][2].get(k) or 0 for i in born)

    @staticmethod
    def _cpu(now, last, same, born, own, kids):
        """The increase of one CPU counter over the set (its own and its reaped children's time),
        less the time already counted of members that left and were reaped by one that stayed."""
        d = 0
        for i in same:
            d += _rise(now[i][2].get(own), last[i][2].get(own)) + _rise(now[i][2].get(kids), last[i][2].get(kids))
        for i in born:
            d += (now[i][2].get(own) or 0) + (now[i][2].get(kids) or 0)
        stayed = set(same)
        owed = {}  # type: dict[int, int]
        for i in last:
            if i in stayed:
                continue
            a, seen = last[i][1], 0  # up the parents it had, through members that left too
            while a in last and a not in stayed and seen < len(last):
                a, seen = last[a][1], seen + 1
            if a in stayed:
                owed[a] = owed.get(a, 0) + (last[i][2].get(own) or 0) + (last[i][2].get(kids) or 0)
        for a, counted in owed.items():
            if _rise(now[a][2].get(kids), last[a][2].get(kids)) >= counted:
                d -= counted  # reaped by a: its children's time holds this member's whole life
        return d


def _rise(cur, prev):
    if cur is None or prev is None or cur < prev:
        return 0
    return cur - prev


class ServiceTree(object):
    """The processes of the service (module docstring): ``scan()`` at each sample."""

    def __init__(self, root, scope=None, port=None, identify=True):
        self.root = int(root)
        self.identify = identify  # read each joining member's command line and role
        self.me = os.getpid()  # the agent: never a member
        self.scope = scope if scope in SCOPES else DEFAULT_SCOPE
        self.port = int(port) if port else None
        self.note = None  # why the processes watched are not quite what the scope asked
        self.members = {}  # pid -> Member
        self.parents = {}  # tree scope: pid -> (parent, start) of every process seen, members or not
        self.group = None  # cgroup scope: the group's directory
        self.joined = []  # the Members that joined at the last scan
        self.left = []  # the pids that left at the last scan

    # -- which processes ------------------------------------------------------------------
    def _descendants(self):
        try:
            listing = set(int(n) for n in os.listdir("/proc") if n.isdigit())
        except OSError:
            return set()
        for pid in [p for p in self.parents if p not in listing]:
            del self.parents[pid]
        new = []
        for pid in listing:
            if pid not in self.parents:
                st = read_stat("/proc/%d/stat" % pid)
                if st is not None:
                    self.parents[pid] = (st.int(4), st.int(22))
                    new.append(pid)
        pids = set(p for p in self.members if p in listing)
        if self.root in listing:
            pids.add(self.root)
        grown = True
        while grown and len(pids) < MAX_TREE_PROCESSES:  # a child listed before its parent joins next pass
            grown = False
            for pid in new:
                if pid not in pids and pid != self.me and self.parents[pid][0] in pids:
                    pids.add(pid)
                    grown = True
        return pids

    def _find_group(self):
        """The cgroup scope's group directory (the first of CGROUP_HIERARCHIES below its root,
        else the first mounted), or None (then the tree is watched, and ``note`` says why)."""
        try:
            mounts = cgroup_mounts(read_text("/proc/self/mountinfo"))
            paths = cgroup_paths(read_text("/proc/%d/cgroup" % self.root))
        except OSError as e:
            self.note = "its cgroup could not be read (%s): its process tree is watched" % (e.strerror or e)
            return None
        found = [(key, group_dir(mounts, paths, key)) for key in CGROUP_HIERARCHIES]
        found = [(key, d) for key, d in found if d is not None and os.path.exists(os.path.join(d, "cgroup.procs"))]
        below = [(key, d) for key, d in found if paths[key].strip("/")]
        if below:
            return below[0][1]
        if found:
            self.note = ("it is in the root cgroup: every process this host (or container) shows is watched")
            return found[0][1]
        self.note = "no cgroup hierarchy of it is mounted here: its process tree is watched"
        return None

    def _group_pids(self):
        out = set()  # type: set[int]
        for d, _, _ in os.walk(self.group):
            try:
                out.update(int(x) for x in read_text(os.path.join(d, "cgroup.procs")).split())
            except (OSError, ValueError):
                continue
            if len(out) >= MAX_TREE_PROCESSES:
                break
        return out

    def _pids(self):
        if self.scope == SCOPE_PROCESS:
            return {self.root}
        if self.scope == SCOPE_CGROUP:
            if self.group is None and self.note is None:
                self.group = self._find_group()
            if self.group is not None:
                return self._group_pids()
        return self._descendants()

    @property
    def watched_scope(self):
        """The scope in effect ("tree" where a cgroup scope found no group to read)."""
        return SCOPE_TREE if self.scope == SCOPE_CGROUP and self.group is None else self.scope

    def scan(self):
        """{pid: Stat} of the members now (their /proc/PID/stat read once); ``joined`` and ``left``
        say what changed.  The root first; an empty dict once the root is gone (tree and process
        scopes) or the group is empty (cgroup scope)."""
        stats = {}
        for pid in sorted(self._pids())[:MAX_TREE_PROCESSES]:
            st = read_stat("/proc/%d/stat" % pid)
            if st is not None and (pid != self.me or pid == self.root):
                stats[pid] = st
        if self.watched_scope != SCOPE_CGROUP and self.root not in stats:
            stats = {}
        left = [p for p, m in self.members.items() if p not in stats or stats[p].int(22) != m.start]
        for pid in left:
            del self.members[pid]
        joined = []
        for pid, st in stats.items():
            m = self.members.get(pid)
            if m is None:
                m = self.members[pid] = Member(pid, st.int(22), st.int(4), st.comm)
                joined.append(m)
            else:
                m.ppid, m.comm = st.int(4), st.comm
        if joined and self.identify:
            self._identify(joined)
        self.joined, self.left = joined, left
        return stats

    def _identify(self, joined):
        """Command line and role of the members that joined (their descriptors read once)."""
        listening = listening_inodes(self.root, self.port)
        held = {}
        for m in joined:
            m.cmdline = cmdline_of(m.pid)
            held[m.pid] = socket_inodes(m.pid) & listening if listening else set()
        for m in joined:
            parent_holds = held.get(m.ppid)
            if parent_holds is None and m.ppid in self.members and listening:
                parent_holds = socket_inodes(m.ppid) & listening
            name = "%s %s" % (m.comm, m.cmdline or "")
            if any(mark in name for mark in ENGINE_MARKS):
                m.role = "engine"
            elif held[m.pid]:
                m.role = "worker" if held[m.pid] & (parent_holds or set()) else "listener"
            elif m.pid != self.root:
                m.role = "worker"

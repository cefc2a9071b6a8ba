"""The monitored service is a process tree (agents/remote/tree.py): the process found and its
descendants, listed again at every sample, or every process of its cgroup.

The truth is the kernel's own counters, read here by the test: a process's utime + stime, and a
parent's cutime + cstime, to which the kernel adds the whole time of each child it reaps.  A root
that reaps every child before the test reads it holds in (u + s + cu + cs) all the CPU its tree
used; the sampler's tree CPU over the same span must equal it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kneeswarm.collectors import get
from tests.conftest import KNEESWARM, REPO, release_cgroups
from tests.treetruth import TREE_CPU_REL, TreeCPU, check_tree_run, stat_of, tree_of

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "agents"))
import remote  # noqa: E402  (the agent package, as its zipapp names it)
from remote.tree import Accounts, CPU_PAIRS, PLAIN_COUNTERS  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
CPU_CGROUP = Path("/sys/fs/cgroup/cpu")
TICK_SLACK = 3  # clock ticks: each read of a counter is rounded down to a tick


# -- the accounts, on counters written by hand from the kernel's rules ------------------------
def member(start, parent, utime, cutime=0, **more):
    return (start, parent, {"utime": utime, "stime": 0, "cutime": cutime, "cstime": 0, **more})


def test_a_reaped_workers_cpu_is_counted_once_and_a_new_one_from_zero():
    acc = Accounts(PLAIN_COUNTERS, CPU_PAIRS)
    acc.advance({1: member(100, 0, 10), 2: member(200, 1, 50)}, mark=None)
    assert acc.totals["utime"] == 60  # what the members hold at the first sample
    # worker 2 ran 30 ticks more and died; the root reaped it (its cutime += 80, the whole life);
    # worker 3 was forked after the last sample and ran 5
    acc.advance({1: member(100, 0, 10, cutime=80), 3: member(900, 1, 5)}, mark=800)
    assert acc.totals["utime"] == 60 + 30 + 5
    # a grandchild reaped by a worker that died too: the worker's parent's cutime holds both
    acc.advance({1: member(100, 0, 10, cutime=80), 3: member(900, 1, 8), 4: member(950, 3, 0)}, mark=900)
    acc.advance({1: member(100, 0, 10, cutime=80 + 8 + 4 + 7)}, mark=990)  # 3 ran 4 more, 4 ran 7
    assert acc.totals["utime"] == 95 + 3 + 4 + 7


def test_a_member_reaped_outside_the_service_loses_only_its_last_interval():
    acc = Accounts(PLAIN_COUNTERS, CPU_PAIRS)
    acc.advance({1: member(100, 0, 10), 2: member(200, 1, 50)}, mark=None)
    acc.advance({1: member(100, 0, 12)}, mark=300)  # 2 was handed to init: no cutime rise
    assert acc.totals["utime"] == 62  # never falls below what was counted
    acc.advance({1: member(100, 0, 12), 5: member(150, 1, 40)}, mark=300)  # moved in, born before: from here on
    acc.advance({1: member(100, 0, 12), 5: member(150, 1, 45)}, mark=300)
    assert acc.totals["utime"] == 67


def test_a_pid_reused_is_a_new_process():
    acc = Accounts(PLAIN_COUNTERS, CPU_PAIRS)
    acc.advance({1: member(100, 0, 10), 2: member(200, 1, 50)}, mark=None)
    acc.advance({1: member(100, 0, 10, cutime=55), 2: member(700, 1, 3)}, mark=600)  # 2 reaped, its pid reused
    assert acc.totals["utime"] == 60 + 5 + 3


# -- real processes -----------------------------------------------------------------------------
#: A root that forks two workers burning CPU, the first without end, the second argv[1] seconds of
#: CPU; on "kill" it SIGKILLs the first mid-burn, reaps it and forks a replacement (argv[1] seconds);
#: on "end" it waits for the others, kills any left and says "done" (its own counters then hold the
#: whole tree's CPU); then it waits to be stopped.  It says "ready" once started (``start_root``).
ROOT_CODE = r"""
import hashlib, os, signal, sys, time
def burn(seconds):
    h = hashlib.sha256(); end = time.thread_time() + seconds
    while time.thread_time() < end:
        h.update(b"x" * 65536)
def worker(seconds):
    pid = os.fork()
    if pid == 0:
        burn(seconds); os._exit(0)
    return pid
print("ready", flush=True)
sys.stdin.readline()
workers = [worker(60.0), worker(float(sys.argv[1]))]
print("started " + " ".join(map(str, workers)), flush=True)
sys.stdin.readline()
os.kill(workers[0], signal.SIGKILL); os.waitpid(workers[0], 0)
workers[0] = worker(float(sys.argv[1]))
print("replaced " + str(workers[0]), flush=True)
if sys.stdin.readline().strip() == "end":
    for w in workers:
        os.waitpid(w, 0)
for w in workers:
    try:
        os.kill(w, signal.SIGKILL); os.waitpid(w, 0)
    except OSError:
        pass
print("done", flush=True)
time.sleep(60)
"""


def start_root(seconds: str) -> subprocess.Popen:
    """ROOT_CODE started, and past its interpreter's start-up: from here it is idle until told "go"
    (a sampler started sooner would count start-up ticks the test's ``before`` reading already holds)."""
    root = subprocess.Popen([sys.executable, "-c", ROOT_CODE, seconds], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    assert root.stdout.readline().strip() == "ready"
    return root


def stop_root(root: subprocess.Popen) -> None:
    """SIGKILL to the root's whole process group: its workers too (killed alone, the root would
    leave them burning, orphaned, through the tests that follow)."""
    try:
        os.killpg(root.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    root.wait()


def own_ticks(pid: int) -> int:
    text = Path(f"/proc/{pid}/stat").read_text()
    return sum(int(x) for x in text[text.rfind(")") + 2:].split()[11:13])


def wait_for_ticks(pid: int, ticks: int, timeout: float = 60.0) -> None:
    """Until ``pid`` used ``ticks`` of CPU (however busy the shared CPUs are)."""
    deadline = time.monotonic() + timeout
    while own_ticks(pid) < ticks:
        assert time.monotonic() < deadline, f"pid {pid} got under {ticks} ticks of CPU in {timeout:g} s"
        time.sleep(0.1)


def tree_ticks(pid: int) -> int:
    """utime + stime + cutime + cstime of ``pid`` (/proc/PID/stat fields 14-17)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return sum(int(x) for x in text[text.rfind(")") + 2:].split()[11:15])


class Sampling:
    """A sampler run on its own thread, as the agent runs it, into a file."""

    def __init__(self, cls, path: Path, **params):
        self.stopping = threading.Event()
        self.sampler = cls(path.stem, str(path), 0.5, self.stopping, **params)
        self.sampler.setup()
        self.path = path

    def __enter__(self):
        self.sampler.start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        self.sampler.join(timeout=10)

    def lines(self) -> list[dict]:
        return [json.loads(x) for x in self.path.read_text().splitlines()]


@pytest.mark.slow
def test_the_tree_keeps_a_killed_workers_cpu_and_picks_up_its_replacement(tmp_path):
    root = start_root("0.8")
    try:
        with Sampling(remote.ProcfsSampler, tmp_path / "procfs.jsonl", pid=root.pid, thread_interval=1.0) as s:
            time.sleep(1.2)  # samples of the root alone, idle
            before = tree_ticks(root.pid)
            root.stdin.write("go\n"), root.stdin.flush()
            first = [int(x) for x in root.stdout.readline().split()[1:]]
            wait_for_ticks(first[0], int(0.6 * CLK_TCK))  # a few samples of it burning
            root.stdin.write("kill\n"), root.stdin.flush()
            new = int(root.stdout.readline().split()[1])
            wait_for_ticks(new, int(0.3 * CLK_TCK))  # the replacement seen burning in a sample or two
            time.sleep(1.0)
            root.stdin.write("end\n"), root.stdin.flush()
            assert root.stdout.readline().strip() == "done"
            after = tree_ticks(root.pid)  # every worker reaped: the root holds the tree's CPU
            time.sleep(1.2)  # samples after the end (nothing more to count)
        lines = s.lines()
    finally:
        stop_root(root)
    idle = [x for x in lines if "procs" in x and len(x["procs"]) == 1]
    first_t, last_t = idle[0]["t"], idle[-1]["t"]
    used = [x["utime"] + x["stime"] for x in lines if x["t"] in (first_t, last_t)]
    truth = after - before
    assert truth >= 2.1 * CLK_TCK, (truth, used)  # 0.6 s of the killed worker, 0.8 s of each other (a tick each)
    assert abs((used[1] - used[0]) - truth) <= TICK_SLACK, (used, truth)
    seen = {p[0] for x in lines for p in x.get("procs", [])}
    assert {root.pid, *first, new} <= seen
    joined = {j[0]: j for x in lines for j in x.get("joined", [])}
    assert joined[new][1] == root.pid and "-c" in joined[new][3]
    assert first[0] in {p for x in lines for p in x.get("left", [])}
    # the parser: the service's CPU over the run is the same ticks, and the new worker has its rows
    parsed = get("procfs").parse(s.path.read_text()).frames
    proc, tree = parsed["process"], parsed["tree"]
    cpu_s = (proc["cpu_pct"] / 100.0 * proc["t"].diff()).sum()
    assert cpu_s == pytest.approx((used[1] - used[0]) / CLK_TCK, abs=TICK_SLACK / CLK_TCK)
    replaced = tree[tree["pid"] == new]
    rows_t = replaced["t"].to_numpy()
    dt = [0.5] + list(rows_t[1:] - rows_t[:-1])  # each row's rate is over the sample interval before it
    own_s = (replaced["cpu_pct"].to_numpy() / 100.0 * dt).sum()
    # its 0.8 s of CPU, less what it used before its first sample (half a second at most)
    assert len(replaced) >= 2 and own_s > 0.8 - 0.5 - 0.05 and (replaced["ppid"] == root.pid).all()
    assert set(tree.loc[tree["pid"] != root.pid, "role"]) == {"worker"}


@pytest.mark.slow
def test_fds_are_summed_over_the_tree(tmp_path):
    root = start_root("60")
    try:
        root.stdin.write("go\n"), root.stdin.flush()
        workers = [int(x) for x in root.stdout.readline().split()[1:]]
        s = remote.FdSampler("fds", str(tmp_path / "fds.jsonl"), 1.0, threading.Event(), pid=root.pid)
        row = s.sample(time.time())[0]
        truth = {p: len(os.listdir(f"/proc/{p}/fd")) for p in (root.pid, *workers)}
    finally:
        stop_root(root)
    assert dict(row["procs"]) == truth and row["fds"] == sum(truth.values())


BURNER = "import hashlib, time\nh = hashlib.sha256()\nwhile True:\n    h.update(b'x' * 65536)\n"


@pytest.fixture
def cpu_cgroup():
    path = CPU_CGROUP / f"kneeswarm-tree-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
    except OSError as e:
        pytest.skip(f"cannot create a cgroup under {CPU_CGROUP} (needs root and cgroup v1's cpu controller): {e}")
    try:
        yield path
    finally:
        release_cgroups([path])


@pytest.mark.slow
def test_cgroup_scope_watches_every_process_of_the_group_and_the_tree_only_the_descendants(cpu_cgroup, tmp_path):
    """Two unrelated processes in one cgroup (as a container's would be): the cgroup scope of one
    holds both, its tree scope holds it alone; the CPU is theirs, by the kernel's counters."""
    burners = [subprocess.Popen([sys.executable, "-c", BURNER]) for _ in range(2)]
    try:
        for b in burners:
            (cpu_cgroup / "cgroup.procs").write_text(str(b.pid))
        group = Sampling(remote.ProcfsSampler, tmp_path / "cgroup.jsonl", pid=burners[0].pid, scope="cgroup")
        alone = Sampling(remote.ProcfsSampler, tmp_path / "tree.jsonl", pid=burners[0].pid, scope="tree")
        with group, alone:
            time.sleep(2.8)
        g, t = group.lines(), alone.lines()
        ticks = lambda pid: sum(int(x) for x in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[11:13])  # noqa: E731
        assert ticks(burners[1].pid) > 0
    finally:
        for b in burners:
            b.kill()
            b.wait()
    assert g[0]["scope"] == "cgroup" and {p[0] for p in g[-1]["procs"]} == {b.pid for b in burners}
    assert t[0]["scope"] == "tree" and {p[0] for p in t[-1]["procs"]} == {burners[0].pid}
    # the group's CPU is both processes' own: the sum of the per-process rows of the same samples
    for line in g[1:]:
        assert line["utime"] + line["stime"] - g[0]["utime"] - g[0]["stime"] == \
            sum(p[4] + p[5] for p in line["procs"]) - sum(p[4] + p[5] for p in g[0]["procs"])


def test_preflight_names_the_service_and_the_scope(tmp_path):
    from remote.preflight import resolve_process, service

    root = start_root("60")
    try:
        root.stdin.write("go\n"), root.stdin.flush()
        workers = [int(x) for x in root.stdout.readline().split()[1:]]
        tree = service(resolve_process(pid=root.pid), "tree")
        alone = service(resolve_process(pid=root.pid), "process")
    finally:
        stop_root(root)
    assert tree["scope"] == "tree" and tree["members"] == sorted([root.pid, *workers]) and tree["member_count"] == 3
    assert alone["scope"] == "process" and alone["members"] == [root.pid]


def test_a_prefork_listener_and_its_workers_are_told_apart(start_demo_target):
    """The demo target's pre-fork mode: the listener holds the port, its workers accept on the
    socket they inherited: roles listener and worker, read from their descriptors."""
    target = start_demo_target("--mode", "prefork", "--workers", "2", "--cpu-ms", "1")
    port = int(target.url.rsplit(":", 1)[1])
    tree = remote.ServiceTree(target.pid, "tree", port)
    tree.scan()
    roles = {m.pid: m.role for m in tree.members.values()}
    assert roles.pop(target.pid) == "listener" and len(roles) == 2 and set(roles.values()) == {"worker"}
    os.kill(target.pid, signal.SIGTERM)


@pytest.mark.slow
def test_a_real_run_on_a_prefork_server_that_recycles_workers(start_demo_target, tmp_path):
    """kneeswarm run on the demo target's pre-fork mode, its workers recycled every 100 requests
    (several replaced mid-run, each living a second or two): the service's CPU in process.csv is
    the kernel's over the same span within 5 % (a worker's CPU after its last sample is in the
    listener's cutime), and the replacements are in the report's tree beside the first workers."""
    from kneeswarm.contracts.plan import HostPlan
    from kneeswarm.contracts.planfile import load_plan
    from kneeswarm.launch.conductor import Conductor

    target = start_demo_target("--mode", "prefork", "--workers", "2", "--cpu-ms", "10", "--max-requests", "100")
    plan = load_plan(None, {"name": "prefork", "target": target.url, "load.steps": [1, 2], "load.hold": 4.0,
                            "load.ramp": 1.0, "load.settle": 1.0, "load.workers": 1, "analysis.min_requests": 10})
    plan.hosts = [HostPlan(name="local", port=int(target.url.rsplit(":", 1)[1]))]
    with TreeCPU(target.pid) as truth:
        result = Conductor(plan, tmp_path, quiet=True).run()
    assert result.ended == "completed" and result.summary is not None
    proc = pd.read_csv(result.run.host_dir("local") / "process.csv")
    t = proc["t"].to_numpy()
    agent_s = float((proc["cpu_pct"].to_numpy()[1:] / 100.0 * np.diff(t)).sum())
    kernel_s = truth.seconds(t[0], t[-1])
    assert kernel_s > 0.5 and agent_s == pytest.approx(kernel_s, rel=TREE_CPU_REL), (agent_s, kernel_s)
    tree = result.summary["hosts"]["local"]["tree"]
    assert tree["count"] >= 4 and tree["at_once"] == 3  # the listener, its first 2 workers, replacements
    roles = {p["pid"]: p.get("role") for p in tree["processes"]}
    assert roles.pop(target.pid) == "listener" and set(roles.values()) == {"worker"}
    assert result.summary["hosts"]["local"]["process"]["scope"] == "tree"


PREFORK_WORKERS, PREFORK_CPU_MS = 4, 20  # single-threaded workers, real CPU per request: on 2 cores the
PREFORK_STEPS, PREFORK_HOLD = (1, 2, 4, 8), 8.0  # CPUs fill before the workers do


@pytest.mark.long
def test_a_real_run_on_a_prefork_server_watches_its_workers_against_the_kernel(start_demo_target, tmp_path):
    """The installed `kneeswarm run` on the demo target's pre-fork mode (PREFORK_WORKERS processes,
    PREFORK_CPU_MS of CPU a request), the server found by the target's port: the same checks as
    TorchServe's workers and Triton's stubs in tests_conformance/ (tests/treetruth.py): the tree's
    CPU within 5 % of the kernel's, the CPU findings after the knee as the kernel's share of the
    host says, and the report's line per worker."""
    target = start_demo_target("--mode", "prefork", "--workers", str(PREFORK_WORKERS), "--cpu-ms", str(PREFORK_CPU_MS))
    workers = {p: st[0] for p in tree_of(target.pid) if p != target.pid and (st := stat_of(p)) is not None}
    assert len(workers) == PREFORK_WORKERS and set(workers.values()) == {target.pid}, workers
    with TreeCPU(target.pid) as truth:
        res = subprocess.run([KNEESWARM, "run", "--target", target.url, "--steps", ",".join(map(str, PREFORK_STEPS)),
                              "--hold", str(PREFORK_HOLD), "--ramp", "1", "--settle", "1", "--workers", "2",
                              "--out", str(tmp_path / "out"), "--name", "prefork-tree"],
                             capture_output=True, text=True, timeout=240, cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 0, res.stderr[-3000:]
    assert {p for p in tree_of(target.pid) if p != target.pid} == set(workers)  # the same workers throughout
    runs = [p for p in (tmp_path / "out").iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    check_tree_run(runs[0], truth, workers)

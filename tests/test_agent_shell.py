"""The shell agent (agents/remote.sh): a host without python3, or with one older than 3.6, is
monitored all the same -- real pidstat and vmstat started by POSIX sh with the same raw files,
clock offsets, watch-channel stop, heartbeat watchdog and verified fetch as remote.pyz.

Run on this machine through the ``local`` transport whose python is a path that does not exist
(the probe then finds no python3, as on a distroless container), or pyenv's python 2.7; the
lifecycle on busybox's userland alone.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from kneeswarm.agents import AgentError, AgentSettings, open_agent
from kneeswarm.agents.local import LocalTransport
from kneeswarm.contracts.plan import HostPlan
from kneeswarm.contracts.rundir import RunDir

try:
    from sshd_fixture import REPO, collector_pids, killed_controller, stop_proc, wait_until_gone
except ImportError:  # tests/ imported as a package
    from tests.sshd_fixture import REPO, collector_pids, killed_controller, stop_proc, wait_until_gone

SCRIPT = REPO / "agents" / "remote.sh"
NO_PYTHON = "/nonexistent/bin/python3"
PYTHON27 = "/root/.pyenv/versions/2.7.18/bin/python"
HAVE_TOOLS = shutil.which("pidstat") and shutil.which("vmstat")
CPU_TOL_POINTS = 15.0  # pidstat's mean cpu_pct vs the kernel's utime+stime over ~the same seconds
CLOCK_TOL = 0.05  # seconds: the "host" is this machine, so a measured offset is all error


@pytest.fixture
def run(tmp_path):
    return RunDir.create(tmp_path, "shell")


def no_python() -> LocalTransport:
    return LocalTransport(label="local", python=[NO_PYTHON])


def minimal_userland(bindir: Path) -> bool:
    """A PATH directory as a minimal container has it: busybox's sh and applets (its date has no
    %N: the agent's clock then comes from /proc/uptime) and the collectors; False without busybox."""
    busybox = shutil.which("busybox")
    if busybox is None:
        return False
    bindir.mkdir()
    applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True).stdout.split()
    for name in applets:
        (bindir / name).symlink_to(busybox)
    for tool in ("pidstat", "vmstat"):
        (bindir / tool).symlink_to(shutil.which(tool))
    return True


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TOOLS, reason="pidstat/vmstat (sysstat, procps) not installed")
def test_shell_agent_records_busy_process_verified_and_leaves_nothing(busy, run, tmp_path, monkeypatch):
    """On busybox alone where the machine has it (apt-get install busybox), else on this PATH."""
    if minimal_userland(tmp_path / "bin"):
        monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    host = HostPlan(pid=busy.pid, collectors=["pidstat", "vmstat", "procfs"])
    settings = AgentSettings(interval=1, max_duration=60, heartbeat_timeout=10)
    with open_agent(host, run, settings, transport=no_python()) as agent:
        facts = agent.preflight()
        assert facts["python"] is None and facts["process"]["pid"] == busy.pid
        assert facts["cpu"]["logical_cpus"] == os.cpu_count()
        assert facts["collectors"]["procfs"]["enabled"] is False
        assert "python agent" in facts["collectors"]["procfs"]["reason"]
        agent.start()
        remote_dir, pids = agent.remote_dir, collector_pids(agent.start_status)
        assert {"pidstat", "vmstat"} <= set(pids)
        cpu0, t0 = sum(psutil.Process(busy.pid).cpu_times()[:2]), time.time()
        time.sleep(3.5)
        agent.fetch()
        assert (run.raw_dir("local") / "pidstat.txt").stat().st_size > 0
        kernel_pct = 100 * (sum(psutil.Process(busy.pid).cpu_times()[:2]) - cpu0) / (time.time() - t0)
        info = agent.stop()
        assert info["reason"] == "signal SIGTERM", info
        agent.fetch(final=True)
        assert agent.fetch_info["verified"], agent.fetch_info
        assert not os.path.exists(remote_dir)
        agent.write_parsed()
        meta = agent.meta()
    assert wait_until_gone(remote_dir, pids, 5.0) == []
    assert meta["agent"]["kind"] == "shell" and "procfs" in meta["agent"]["lost"]
    assert meta["complete"]
    for when in ("before", "after"):  # one machine: the true offset is 0 (to /proc/uptime's 10 ms on busybox)
        assert abs(meta["clock"][when]["offset"]) < CLOCK_TOL, meta["clock"]
    proc = pd.read_csv(run.host_dir("local") / "process.csv")
    assert len(proc) >= 3 and proc["pid"].eq(busy.pid).all()
    # the spinning thread as pidstat saw it, against the kernel's own counters over the same seconds
    assert abs(proc["cpu_pct"].mean() - kernel_pct) < CPU_TOL_POINTS, (proc["cpu_pct"].tolist(), kernel_pct)
    assert kernel_pct > 5
    assert len(pd.read_csv(run.host_dir("local") / "vmstat.csv")) >= 3
    assert not (run.host_dir("local") / "process.procfs.csv").exists()


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TOOLS, reason="pidstat/vmstat (sysstat, procps) not installed")
def test_shell_agent_follows_the_tree_a_worker_replaced_mid_run(run, tmp_path, monkeypatch):
    """pidstat through collectors/pidstat.py's TREE_SCRIPT (on busybox's sh, awk and sed where the
    machine has it): a worker killed and replaced is dropped and the new one picked up, each with
    its parent; what the shell agent loses is the interval around each restart of pidstat."""
    from tests.test_tree import own_ticks, start_root, stop_root, tree_ticks, wait_for_ticks

    if minimal_userland(tmp_path / "bin"):
        monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    root = start_root("60")
    try:
        settings = AgentSettings(interval=1, max_duration=60, heartbeat_timeout=10)
        with open_agent(HostPlan(pid=root.pid, collectors=["pidstat"]), run, settings, transport=no_python()) as agent:
            facts = agent.preflight()
            assert facts["process"]["scope"] == "tree"
            agent.start()
            time.sleep(1.5)
            root.stdin.write("go\n"), root.stdin.flush()
            first = [int(x) for x in root.stdout.readline().split()[1:]]
            t0, before = time.time(), tree_ticks(root.pid) + sum(own_ticks(p) for p in first)
            wait_for_ticks(first[0], 300)
            root.stdin.write("kill\n"), root.stdin.flush()
            new = int(root.stdout.readline().split()[1])
            wait_for_ticks(new, 300)
            kernel_s = (tree_ticks(root.pid) + own_ticks(first[1]) + own_ticks(new) - before) / 100.0
            t1 = time.time()
            agent.stop()
            agent.fetch(final=True)
            agent.write_parsed()
    finally:
        stop_root(root)
    hd = run.host_dir("local")
    proc, tree = pd.read_csv(hd / "process.csv"), pd.read_csv(hd / "tree.csv")
    assert {root.pid, *first, new} <= set(proc["pid"])
    workers = tree[tree["pid"] != root.pid]
    assert set(workers["pid"]) == {*first, new} and (workers["ppid"] == root.pid).all()
    assert (workers["role"] == "worker").all() and tree.loc[tree["pid"] == new, "cmdline"].notna().sum() == 1
    # the service's CPU: pidstat's per-process %CPU summed at each sample, over the span; at most a
    # restart's interval or two of it lost, never more than the kernel counted
    per_t = proc[(proc["t"] > t0) & (proc["t"] <= t1)].groupby("t")["cpu_pct"].sum()
    agent_s = float(per_t.sum()) / 100.0  # one-second samples
    assert 0.6 * kernel_s < agent_s < 1.05 * kernel_s + 0.1, (agent_s, kernel_s)


CONTROLLER = """
import json, sys, time
sys.path.insert(0, {repo!r})
from kneeswarm.contracts.plan import HostPlan
from kneeswarm.contracts.rundir import RunDir
from kneeswarm.agents import AgentSettings, open_agent
from kneeswarm.agents.local import LocalTransport
agent = open_agent(HostPlan(pid={pid}), RunDir({run!r}), AgentSettings(interval=1, max_duration=120, heartbeat_timeout=60),
                   transport=LocalTransport(python=[{python!r}]))
agent.preflight()
agent.start()
print(json.dumps({{"remote_dir": agent.remote_dir, "status": agent.start_status}}), flush=True)
time.sleep(120)
"""


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TOOLS, reason="pidstat/vmstat not installed")
def test_shell_agent_stops_everything_when_the_controller_is_killed(busy, run):
    code = CONTROLLER.format(repo=str(REPO), pid=busy.pid, run=str(run.path), python=NO_PYTHON)
    with killed_controller(code, 12.0, lambda d: shutil.rmtree(d, ignore_errors=True)) as (remote_dir, left):
        assert left == []  # the heartbeat timeout is 60 s: only the closed watch channel can stop it this soon
        deadline = time.monotonic() + 5
        while (Path(remote_dir) / "agent.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        status = json.loads((Path(remote_dir) / "status.json").read_text())
        assert status["state"] == "stopped" and status["reason"].startswith("controller gone"), status["reason"]
        assert (Path(remote_dir) / "MANIFEST.json").exists()


def _sh(*args: str, stdin: str | None = None, timeout: float = 30) -> dict:
    out = subprocess.run(["sh", str(SCRIPT), *args], input=stdin, capture_output=True, text=True, timeout=timeout)
    return json.loads(out.stdout)


def test_shell_agent_heartbeat_timeout_stops_it_and_a_bad_command_is_reported(tmp_path):
    shutil.copy(SCRIPT, tmp_path / "remote.sh")
    (tmp_path / "agent.conf").write_text("HEARTBEAT_TIMEOUT=1\nMAX_DURATION=60\n"
                                         "collector nope nope.txt no-such-tool-xyz --flag\n"
                                         "collector sleep sleep.txt sleep 60\n")
    out = _sh("start", str(tmp_path / "agent.conf"))
    assert out["ok"], out
    col = out["status"]["collectors"]
    assert col["nope"]["running"] is False and col["nope"]["exit_code"] == 127, col["nope"]
    assert "no-such-tool-xyz" in col["nope"]["error"]
    pid, start = col["sleep"]["pid"], col["sleep"]["start_time"]
    try:
        assert wait_until_gone(str(tmp_path), {"sleep": (pid, start)}, 10.0) == []
        deadline = time.monotonic() + 5
        while (tmp_path / "agent.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        status = json.loads((tmp_path / "status.json").read_text())
        assert status["state"] == "stopped" and status["reason"].startswith("heartbeat lost"), status["reason"]
    finally:
        stop = _sh("stop", str(tmp_path))
    assert stop["ok"] and stop["reason"].startswith("heartbeat lost")
    files = stop["manifest"]["files"]
    import hashlib

    for name in ("sleep.txt", "nope.err", "status.json"):  # sha256 as Python computes it
        assert files[name]["sha256"] == hashlib.sha256((tmp_path / name).read_bytes()).hexdigest(), name


def test_shell_preflight_finds_the_process_by_port_and_by_regex_as_remote_py_does(tmp_path):
    code = "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); print(s.getsockname()[1], flush=True); time.sleep(60)"
    srv = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        port = int(srv.stdout.readline())
        conf = tmp_path / "preflight.conf"
        for line in (f"PORT={port}", "PROCESS='s\\.bind\\(..127\\.0\\.0\\.1'", f"PID={srv.pid}"):
            conf.write_text("check sh sh -c 'echo v1.2'\ncheck gone no-such-x\n" + line + "\n")
            facts = _sh("preflight", str(conf))
            assert facts["process"]["pid"] == srv.pid, (line, facts["process"])
        assert facts["tools"]["sh"]["output"] == "v1.2" and facts["tools"]["gone"]["found"] is False
        assert facts["cpu"]["logical_cpus"] == os.cpu_count() and facts["samplers"] == []
        with socket.socket() as s:  # a port nobody listens on
            s.bind(("127.0.0.1", 0))
            free = s.getsockname()[1]
        conf.write_text(f"PORT={free}\n")
        assert "nothing listens" in _sh("preflight", str(conf))["process"]["error"]
    finally:
        stop_proc(srv)


def test_a_python_older_than_3_6_gets_the_shell_agent_and_says_why(run):
    if not os.path.exists(PYTHON27):
        pytest.skip(f"{PYTHON27} is not installed")
    with open_agent(HostPlan(pid=os.getpid(), collectors=["vmstat"]), run,
                    transport=LocalTransport(python=[PYTHON27])) as agent:
        agent.preflight()
        meta = agent.meta()
    assert meta["agent"]["kind"] == "shell" and meta["agent"]["python"] == "2.7", meta["agent"]
    assert "needs 3.6 or newer" in meta["agent"]["why"]


def test_no_python3_and_no_collector_is_one_line(run, tmp_path, monkeypatch):
    bare = tmp_path / "bin"
    bare.mkdir()
    for name in os.listdir("/usr/bin"):
        if not name.startswith("python") and name not in ("pidstat", "vmstat", "nvidia-smi"):
            (bare / name).symlink_to(f"/usr/bin/{name}")
    monkeypatch.setenv("PATH", str(bare))
    with open_agent(HostPlan(pid=os.getpid()), run, transport=no_python()) as agent:
        with pytest.raises(AgentError) as e:
            agent.preflight()
    msg = str(e.value)
    assert "\n" not in msg and f"{NO_PYTHON} is not on the host" in msg
    assert all(t in msg for t in ("pidstat", "vmstat", "nvidia-smi")), msg


def test_the_plan_names_the_hosts_python_and_a_missing_one_gets_the_shell_agent(tmp_path):
    """[[hosts]] python = "...": the interpreter the agent runs with (RHEL 8's platform-python)."""
    from kneeswarm.agents.host import make_transport
    from kneeswarm.contracts.planfile import load_plan

    py36 = "/root/.pyenv/versions/3.6.15/bin/python3"
    if not os.path.exists(py36):
        pytest.skip(f"{py36} is not installed")
    for python, kind, version in ((py36, "python", "3.6"), ("/nonexistent/platform-python", "shell", None)):
        plan_file = tmp_path / "p.toml"
        plan_file.write_text(f'target = "http://127.0.0.1:9"\n[[hosts]]\npid = {os.getpid()}\n'
                             f'collectors = ["vmstat"]\npython = "{python}"\n')
        host = load_plan(plan_file).hosts[0]
        run = RunDir.create(tmp_path, kind)
        with open_agent(host, run, transport=make_transport(host)) as agent:
            facts = agent.preflight()
            meta = agent.meta()
        assert meta["agent"]["kind"] == kind and meta["agent"]["python"] == version, meta["agent"]
        assert (facts["python"] or "").startswith(version or "")
    assert meta["agent"]["why"] == "/nonexistent/platform-python is not on the host"


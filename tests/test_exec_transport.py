"""The exec transport across real namespace boundaries (tests/containers.py): a "container" made by
unshare (its own PID, mount, network namespaces, a busybox root, a cpu cgroup with half a CPU),
entered with nsenter as kubectl/docker exec enter a pod's container.

- with python3 in the container: the python agent runs inside, finds the server by its port in
  the container's own network and PID namespaces, its /proc sampler records the server against
  the kernel's own counters, its cgroup sampler reads the quota the test wrote;
- a busybox container (no python3, no pidstat, no vmstat): one line naming the way out, and the way
  out itself, a debug container sharing its PID namespace (kubectl debug --target), monitors it;
- a container whose PATH has no sh: one line at open;
- the controller killed with -9: nothing of the agent is left running in the container.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pandas as pd
import psutil
import pytest
import requests

from kneeswarm.agents import AgentError, AgentSettings, open_agent
from kneeswarm.agents.exec import EXEC_ROOT, ExecTransport
from kneeswarm.agents.host import make_transport
from kneeswarm.contracts.plan import HostPlan
from kneeswarm.contracts.rundir import RunDir

from containers import PERIOD_US, QUOTA_US, REPO, Container, skip_without_namespaces, start_container, start_debug

pytestmark = pytest.mark.slow

SERVER = ["--mode", "knee", "--slots", "4", "--service-ms", "5", "--cpu-work-per-inflight", "2"]
CPU_TOL_POINTS = 15.0  # the /proc sampler's mean cpu_pct vs the kernel's utime+stime over about the same seconds
CLOCK_TOL = 0.05  # seconds: the "container" shares this machine's clock, so a measured offset is all error
BODY = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [0.0, 1.0, 2.0, 3.0]}]}


@pytest.fixture
def containers(tmp_path):
    skip_without_namespaces()
    made: list[Container] = []

    def start(python: bool) -> Container:
        c = start_container(tmp_path, python, SERVER)
        made.append(c)
        return c

    try:
        yield start
    finally:
        for c in made:
            c.stop()


def _load(url: str, stop: threading.Event) -> None:
    """Requests to the container's server until ``stop`` (bounded: 60 s at most)."""
    deadline = time.monotonic() + 60
    with requests.Session() as s:
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                s.post(f"{url}/v2/models/demo/infer", json=BODY, timeout=5)
            except requests.RequestException:
                time.sleep(0.05)


def _host_pid(c: Container) -> int:
    """The server's pid as this machine sees it (the truth's side of the namespace boundary)."""
    pids = [pid for pid, cmd in c.processes() if " -m kneeswarm.target" in cmd and not cmd.startswith("/bin/sh")]
    assert len(pids) == 1, c.processes()
    return pids[0]


def _kernel_cpu(pid: int) -> tuple[float, float]:
    t = psutil.Process(pid).cpu_times()
    return time.time(), t.user + t.system


def _in_container(c: Container, script: str) -> str:
    return subprocess.run([*c.prefix(), "sh", "-c", script], capture_output=True, text=True, timeout=30).stdout


def _monitor(c: Container, prefix: list[str], run: RunDir, label: str) -> dict:
    """One agent's whole lifecycle through ``prefix`` while the server is loaded; what the test reads."""
    host = HostPlan(name=label, exec=prefix, port=c.port)
    stop = threading.Event()
    loaders = [threading.Thread(target=_load, args=(c.url, stop), daemon=True) for _ in range(2)]
    with open_agent(host, run, AgentSettings(interval=1, max_duration=60, heartbeat_timeout=15)) as agent:
        assert isinstance(agent.t, ExecTransport)
        facts = agent.preflight()
        agent.start()
        remote_dir = agent.remote_dir
        assert remote_dir is not None and remote_dir.startswith(EXEC_ROOT + "/")
        for t in loaders:
            t.start()
        cpu0 = _kernel_cpu(_host_pid(c))
        time.sleep(4.5)
        agent.fetch()  # incremental, through the channel
        assert (run.raw_dir(label) / "procfs.jsonl").stat().st_size > 0
        cpu1 = _kernel_cpu(_host_pid(c))
        stop.set()
        agent.stop()
        agent.fetch(final=True)
        agent.write_parsed()
        meta = agent.meta()
    for t in loaders:
        t.join(timeout=10)
    kernel_pct = 100.0 * (cpu1[1] - cpu0[1]) / (cpu1[0] - cpu0[0])
    return {"facts": facts, "meta": meta, "remote_dir": remote_dir, "kernel_pct": kernel_pct,
            "window": (cpu0[0], cpu1[0])}


def _check_monitored(c: Container, out: dict, run: RunDir, label: str) -> None:
    meta, facts = out["meta"], out["facts"]
    assert meta["transport"] == "exec" and meta["transfer"] == "exec" and meta["complete"], meta
    assert meta["agent"]["kind"] == "python" and meta["fetch"]["verified"], meta
    # found by its port, inside the container's own network and PID namespaces: its pid there
    assert facts["process"]["pid"] == c.server_pid() != _host_pid(c)
    for when in ("before", "after"):
        assert abs(meta["clock"][when]["offset"]) < CLOCK_TOL, meta["clock"]
    # the /proc sampler's process table, against the kernel's own count for the server's host pid
    proc = pd.read_csv(run.host_dir(label) / "process.csv")
    t0, t1 = out["window"]
    window = proc[(proc["t"] > t0 + 1) & (proc["t"] <= t1)]
    assert len(window) >= 2 and proc["pid"].eq(c.server_pid()).all()
    assert abs(window["cpu_pct"].mean() - out["kernel_pct"]) < CPU_TOL_POINTS, (window["cpu_pct"].tolist(), out)
    assert out["kernel_pct"] > 5
    # the container's cgroup: the quota the test wrote, half a CPU
    cg = pd.read_csv(run.host_dir(label) / "cgroup.csv")
    assert len(cg) >= 3 and cg["quota_cpus"].dropna().eq(QUOTA_US / PERIOD_US).all(), cg.tail()
    # what was uploaded is gone, and nothing of the agent runs in the container
    assert _in_container(c, f"test -e {out['remote_dir']} && echo there || echo gone").strip() == "gone"
    assert [cmd for _, cmd in c.processes() if "remote.pyz" in cmd] == []


def test_python_container_is_monitored_through_nsenter(containers, tmp_path):
    c = containers(python=True)
    run = RunDir.create(tmp_path, "py")
    out = _monitor(c, c.prefix(), run, "ctr")
    _check_monitored(c, out, run, "ctr")
    assert out["facts"]["python"].startswith("3.")


def test_busybox_container_is_one_line_naming_the_debug_container_then_monitored_from_one(containers, tmp_path):
    c = containers(python=False)
    run = RunDir.create(tmp_path, "bb")
    with open_agent(HostPlan(name="bb", exec=c.prefix(), port=c.port), run) as agent:
        with pytest.raises(AgentError) as e:
            agent.preflight()
    msg = str(e.value)
    assert "\n" not in msg and "python3 is not on the host's PATH" in msg and "pidstat" in msg, msg
    assert "debug container" in msg and "kubectl debug --target" in msg and "debug_image" in msg, msg
    assert _in_container(c, f"ls {EXEC_ROOT}/*/ 2>/dev/null | wc -l").strip() == "0"  # the unused upload removed
    # the way out: a debug container in its PID and network namespaces, with python3 of its own
    d = start_debug(c)
    out = _monitor(c, d.prefix(), run, "bb-debug")
    _check_monitored(c, out, run, "bb-debug")


def test_a_container_without_sh_is_one_line_at_open(containers, tmp_path):
    c = containers(python=False)
    (c.root / "bin" / "sh").unlink()  # PATH has no sh now (PID 1 already runs)
    with pytest.raises(AgentError) as e:
        make_transport(HostPlan(name="nosh", exec=c.prefix()))
    msg = str(e.value)
    assert "\n" not in msg and "has no shell" in msg and "debug container" in msg, msg
    with pytest.raises(AgentError) as e:
        make_transport(HostPlan(name="nokubectl", exec=["/nonexistent/kubectl", "exec", "-i", "pod/x", "--"]))
    assert "cannot run the exec prefix's /nonexistent/kubectl" in str(e.value)


CONTROLLER = """
import json, sys, time
sys.path.insert(0, {repo!r})
from kneeswarm.contracts.plan import HostPlan
from kneeswarm.contracts.rundir import RunDir
from kneeswarm.agents import AgentSettings, open_agent
agent = open_agent(HostPlan(name="ctr", exec={prefix!r}, port={port}), RunDir({run!r}),
                   AgentSettings(interval=1, max_duration=120, heartbeat_timeout=60))
agent.preflight()
agent.start()
print(json.dumps({{"remote_dir": agent.remote_dir, "status": agent.start_status}}), flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("python", [True, False], ids=["python-container", "busybox-via-debug-container"])
def test_controller_killed_leaves_nothing_running_in_the_container(containers, tmp_path, python):
    c = containers(python=python)
    prefix = c.prefix() if python else start_debug(c).prefix()
    run = RunDir.create(tmp_path, "killed")
    code = CONTROLLER.format(repo=str(REPO), prefix=prefix, port=c.port, run=str(run.path))
    ctl = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert ctl.stdout is not None
        started = json.loads(ctl.stdout.readline())
        assert {"procfs", "cgroup"} <= set(started["status"]["collectors"])
        agent_cmds = [cmd for _, cmd in c.processes() if "remote.pyz" in cmd]
        assert agent_cmds, c.processes()  # the agent runs in the container's PID namespace
        time.sleep(1.0)
        ctl.kill()
        ctl.wait(timeout=10)
        deadline = time.monotonic() + 15  # the watch's EOF grace (5 s) and the agent's stop
        while [cmd for _, cmd in c.processes() if "remote.pyz" in cmd] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [cmd for _, cmd in c.processes() if "remote.pyz" in cmd] == [], c.processes()
        status = json.loads(subprocess.run([*prefix, "cat", f"{started['remote_dir']}/status.json"],
                                           capture_output=True, text=True, timeout=30).stdout)
        assert status["state"] == "stopped" and status["reason"].startswith("controller gone"), status
    finally:
        if ctl.poll() is None:
            ctl.kill()
            ctl.wait()

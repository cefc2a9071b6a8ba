"""The agent on this machine (``local`` transport, no SSH): real pidstat, vmstat and /proc sampler.

Also: the watchdog after a SIGKILLed controller, the clock offset under libfaketime, and the
remote.py verbs on their own.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from agents import AgentError, AgentSettings, clock, open_agent, write_parsed_csvs
from agents import link as link_mod
from kneeswarm.plan import HostPlan
from kneeswarm.rundir import RunDir

try:
    from faketime_lib import faketime_prefix
    from sshd_fixture import BUSY_THREAD, REPO, collector_pids, start_busy, stop_proc, wait_until_gone
except ImportError:  # tests/ imported as a package
    from tests.faketime_lib import faketime_prefix
    from tests.sshd_fixture import BUSY_THREAD, REPO, collector_pids, start_busy, stop_proc, wait_until_gone

REMOTE = REPO / "agents" / "remote.py"
HAVE_TOOLS = shutil.which("pidstat") and shutil.which("vmstat")


@pytest.fixture
def busy():
    p = start_busy()
    yield p
    stop_proc(p)


@pytest.fixture
def run(tmp_path):
    return RunDir.create(tmp_path, "agents")


@pytest.mark.skipif(not HAVE_TOOLS, reason="pidstat/vmstat (sysstat, procps) not installed")
def test_local_agent_records_busy_process_and_leaves_nothing(busy, run):
    host = HostPlan(pid=busy.pid, collectors=["pidstat", "vmstat", "procfs"])  # procfs too: listed, not by default
    with open_agent(host, run, AgentSettings(interval=1, max_duration=60, heartbeat_timeout=10)) as agent:
        facts = agent.preflight()
        assert facts["process"]["pid"] == busy.pid
        assert facts["cpu"]["logical_cpus"] >= 1 and facts["memory_total_kb"] > 0
        assert facts["tools"]["pidstat"]["version"] and facts["tools"]["vmstat"]["version"]
        assert {"pidstat", "vmstat", "procfs"} <= set(facts["collectors"])
        agent.start()
        remote_dir = agent.remote_dir
        pids = collector_pids(agent.start_status)
        assert {"pidstat", "vmstat"} <= set(pids)
        time.sleep(3.5)
        live = agent.fetch()  # incremental, during the run
        assert (run.raw_dir("local") / "pidstat.txt").stat().st_size > 0, live
        time.sleep(1.0)
        info = agent.stop()
        assert info["reason"].startswith("signal")
        agent.fetch(final=True)
        assert agent.fetch_info["verified"]
        assert not os.path.exists(remote_dir)  # removed after the checksums matched
        stats = agent.write_parsed()
    assert wait_until_gone(remote_dir, pids, 5.0) == []
    assert stats["pidstat"]["skipped"] == 0 and stats["vmstat"]["skipped"] == 0
    proc = pd.read_csv(run.host_dir("local") / "process.csv")
    assert len(proc) >= 3 and proc["pid"].eq(busy.pid).all()
    assert proc["cpu_pct"].median() > 50  # the spinning thread
    vm = pd.read_csv(run.host_dir("local") / "vmstat.csv")
    assert len(vm) >= 3 and {"r", "cs", "us", "sy", "id"} <= set(vm.columns)
    procfs = pd.read_csv(run.host_dir("local") / "process.procfs.csv")
    assert len(procfs) >= 3 and procfs["cpu_pct"].median() > 50
    threads = pd.read_csv(run.host_dir("local") / "threads.csv")
    spin = threads[threads["name"] == BUSY_THREAD]
    assert spin["tid"].nunique() == 1 and spin["tid"].iloc[0] != busy.pid, threads["name"].unique()
    assert len(spin) >= 3 and spin["cpu_pct"].median() > 50  # the spinning thread, by its name
    meta = agent.meta()
    assert meta["clock"]["before"]["error"] < 0.01 and meta["clock"]["after"] is not None
    json.dumps(meta)  # serialisable for meta.json
    # re-running the parse from the raw dir alone, with a known offset, shifts every t
    write_parsed_csvs(run, "local", correction=2.0)
    shifted = pd.read_csv(run.host_dir("local") / "process.csv")
    assert (proc["t"] - shifted["t"]).sub(2.0).abs().max() < 0.01


def test_preflight_fails_with_one_line_when_process_missing(run):
    with open_agent(HostPlan(process=r"no-such-process-\d{9}"), run) as agent:
        with pytest.raises(AgentError) as e:
            agent.preflight()
    msg = str(e.value)
    assert "\n" not in msg and "local" in msg and "no process" in msg
    with open_agent(HostPlan(pid=2**22 + 12345), run) as agent:
        with pytest.raises(AgentError, match="no process with pid"):
            agent.preflight()


def test_preflight_resolves_the_process_listening_on_a_port(run):
    code = "import socket,time\ns=socket.socket(); s.bind(('127.0.0.1',0)); s.listen()\nprint(s.getsockname()[1], flush=True)\ntime.sleep(60)"
    srv = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        port = int(srv.stdout.readline())
        with open_agent(HostPlan(port=port, collectors=["vmstat"]), run) as agent:
            facts = agent.preflight()
        assert facts["process"]["pid"] == srv.pid and facts["process"]["by"] == "port"
        with open_agent(HostPlan(process=r"s\.bind\(\('127\.0\.0\.1'", collectors=["vmstat"]), run) as agent:
            assert agent.preflight()["process"]["pid"] == srv.pid
    finally:
        stop_proc(srv)


CONTROLLER = """
import json, sys, time
sys.path.insert(0, {repo!r})
from kneeswarm.plan import HostPlan
from kneeswarm.rundir import RunDir
from agents import AgentSettings, open_agent
agent = open_agent(HostPlan(pid={pid}), RunDir({run!r}), AgentSettings(interval=1, max_duration=120, heartbeat_timeout=60))
agent.preflight()
agent.start()
print(json.dumps({{"remote_dir": agent.remote_dir, "status": agent.start_status}}), flush=True)
time.sleep(120)
"""


@pytest.mark.skipif(not HAVE_TOOLS, reason="pidstat/vmstat not installed")
def test_watchdog_stops_everything_when_the_controller_is_killed(busy, run):
    code = CONTROLLER.format(repo=str(REPO), pid=busy.pid, run=str(run.path))
    ctl = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        line = ctl.stdout.readline()
        started = json.loads(line)
        remote_dir, pids = started["remote_dir"], collector_pids(started["status"])
        assert {"pidstat", "vmstat"} <= set(pids)
        time.sleep(1.0)
        ctl.send_signal(signal.SIGKILL)
        ctl.wait(timeout=5)
        # the heartbeat timeout is 60 s: only the closed watch channel can stop it this soon
        assert wait_until_gone(remote_dir, pids, 10.0) == []
        status = json.loads((Path(remote_dir) / "status.json").read_text())
        assert status["state"] == "stopped" and status["reason"].startswith("controller gone"), status["reason"]
        assert (Path(remote_dir) / "MANIFEST.json").exists()  # what was recorded is kept, checksummed
    finally:
        if ctl.poll() is None:
            ctl.kill()
        ctl.stdout.close()
        shutil.rmtree(started["remote_dir"], ignore_errors=True) if "started" in locals() else None


BURST_CODE = """
import sys, time
sys.stdin.readline()
end = time.time() + 4.0
while time.time() < end:
    sum(range(10000))
sys.stdin.readline()
"""


@pytest.mark.skipif(not HAVE_TOOLS, reason="pidstat/vmstat not installed")
def test_agent_under_faketime_offset_within_20ms_and_burst_aligned(run, monkeypatch):
    shifted = faketime_prefix(2.5)  # skips without faketime, fails when it is there but broken
    monkeypatch.setattr(link_mod, "ECHO_WRAPPER", shifted)
    monkeypatch.setattr(link_mod, "AGENT_WRAPPER", shifted)  # the agent and its collectors: +2.5 s
    burst = subprocess.Popen([sys.executable, "-c", BURST_CODE], stdin=subprocess.PIPE)
    try:
        host = HostPlan(pid=burst.pid, collectors=["pidstat", "vmstat", "procfs"])
        with open_agent(host, run, AgentSettings(interval=1, max_duration=60, heartbeat_timeout=10)) as agent:
            agent.preflight()
            agent.start()
            time.sleep(1.5)
            t_burst = time.time()  # master clock
            burst.stdin.write(b"go\n")
            burst.stdin.flush()
            time.sleep(6.0)
            agent.stop()
            agent.fetch(final=True)
            agent.write_parsed()
    finally:
        stop_proc(burst)
    for off in (agent.clock.before, agent.clock.after):
        assert off is not None and abs(off.offset - 2.5) < 0.020, off
    raw_t = [json.loads(x)["t"] for x in (run.raw_dir("local") / "procfs.jsonl").read_text().splitlines()]
    assert raw_t[0] > t_burst - 1.5 + 2.5 - 1.0  # the host recorded on its shifted clock
    df = pd.read_csv(run.host_dir("local") / "process.procfs.csv")  # samples stamped at interval end
    # > 50: one spinning thread, on 2 cores shared with other tests, does not always get > 90%
    busy = df[df["cpu_pct"] > 50]["t"] - t_burst
    assert len(busy) >= 2, df[["t", "cpu_pct"]].assign(t=df["t"] - t_burst).to_string()
    assert busy.min() > 0.5 and busy.max() < 4.0 + 1.2, busy.tolist()  # inside the burst, on the master's clock
    onset = df[df["cpu_pct"] > 20]["t"].min() - t_burst
    assert 0.0 < onset < 1.3  # unaligned, it would be about 2.5 s later


def test_clock_estimate_keeps_the_lowest_rtt_round_trips():
    true_offset = 0.75
    samples = []
    t = 1000.0
    for i in range(50):
        up, down = (0.0002, 0.0002) if i % 5 == 0 else (0.0002 + 0.01 * (i % 3), 0.0002)  # queueing on the way up
        t1 = t
        t2 = t1 + up + true_offset
        t3 = t2 + 0.00001
        t4 = t3 - true_offset + down
        samples.append((t1, t2, t3, t4))
        t += 0.01
    est = clock.estimate(samples, keep=10)
    assert abs(est.offset - true_offset) <= est.error + 1e-9
    assert est.error < 0.001 and est.rtt_min == pytest.approx(0.0004, abs=1e-6)


def test_clock_correction_interpolates_drift():
    b = clock.ClockOffset(1.0, 0.001, 0.002, 0.002, 50, 10, t=1000.0)
    a = clock.ClockOffset(1.1, 0.001, 0.002, 0.002, 50, 10, t=2000.0)
    cc = clock.ClockCorrection(b, a)
    assert cc.drift_ppm == pytest.approx(100.0)
    assert cc.offset_at(1501.05) == pytest.approx(1.05, abs=1e-3)
    assert cc.to_master([1001.0])[0] == pytest.approx(1000.0, abs=1e-9)
    again = clock.ClockCorrection.from_dict(json.loads(json.dumps(cc.to_dict())))
    assert again.offset_at(1800.0) == cc.offset_at(1800.0)


# -- remote.py on its own ----------------------------------------------------------------------
def _remote(*args: str, timeout: float = 30) -> dict:
    out = subprocess.run([sys.executable, str(REMOTE), *args], capture_output=True, text=True, timeout=timeout)
    return json.loads(out.stdout)


def test_remote_max_duration_stops_the_agent_and_a_bad_command_is_reported(tmp_path):
    (tmp_path / "remote.py").write_bytes(REMOTE.read_bytes())
    cfg = {"interval": 1, "heartbeat_timeout": 60, "max_duration": 1.5,
           "collectors": [{"name": "nope", "argv": ["no-such-tool-xyz"], "raw_file": "nope.txt"},
                          {"name": "procfs", "sampler": "procfs", "params": {"pid": os.getpid()},
                           "raw_file": "procfs.jsonl"}]}
    (tmp_path / "agent.json").write_text(json.dumps(cfg))
    out = _remote("start", str(tmp_path / "agent.json"))
    assert out["ok"]
    nope = out["status"]["collectors"]["nope"]
    assert not nope["running"] and "no-such-tool-xyz" in nope["error"]
    deadline = time.monotonic() + 8
    while (tmp_path / "agent.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["reason"].startswith("max_duration") and status["state"] == "stopped"
    lines = [json.loads(x) for x in (tmp_path / "procfs.jsonl").read_text().splitlines()]
    assert lines and {"utime", "stime", "rss_kb", "vol_cs", "tasks"} <= set(lines[-1])
    stop = _remote("stop", str(tmp_path))  # idempotent after the agent stopped itself
    assert stop["ok"] and "procfs.jsonl" in stop["manifest"]["files"]


def test_remote_preflight_reports_tools_and_topology():
    facts = _remote("preflight", json.dumps({"checks": {"sh": ["sh", "-c", "echo v1.2"], "gone": ["no-such-x"]},
                                             "pid": os.getpid()}))
    assert facts["tools"]["sh"]["output"].strip() == "v1.2" and facts["tools"]["gone"]["found"] is False
    assert facts["process"]["pid"] == os.getpid()
    cpu = facts["cpu"]
    assert cpu["logical_cpus"] == os.cpu_count()
    assert cpu["physical_cores"] * cpu["threads_per_core"] == cpu["logical_cpus"]
    # the kernel's own topology is the independent truth: packages are sockets, (package, core) cores
    topo = [(Path(d, "physical_package_id").read_text().strip(), Path(d, "core_id").read_text().strip())
            for d in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/topology")]
    if topo:
        assert cpu["sockets"] == len({p for p, _ in topo}) and cpu["physical_cores"] == len(set(topo))


def test_remote_echo_answers_each_line_with_two_timestamps():
    p = subprocess.Popen([sys.executable, str(REMOTE), "echo"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    out, _ = p.communicate(b"a\nb\n", timeout=10)
    rows = [list(map(float, line.split())) for line in out.decode().splitlines()]
    assert len(rows) == 2 and all(abs(r[0] - time.time()) < 5 and r[1] >= r[0] for r in rows)


def test_remote_heartbeat_timeout_stops_an_agent_nobody_renews(tmp_path):
    """No watch channel, no heartbeat (a network cut): the heartbeat timeout stops the agent."""
    (tmp_path / "remote.py").write_bytes(REMOTE.read_bytes())
    cfg = {"interval": 1, "heartbeat_timeout": 1.5, "max_duration": 60,
           "collectors": [{"name": "sleep", "argv": ["sleep", "60"], "raw_file": "sleep.txt"}]}
    (tmp_path / "agent.json").write_text(json.dumps(cfg))
    out = _remote("start", str(tmp_path / "agent.json"))
    pid, start = out["status"]["collectors"]["sleep"]["pid"], out["status"]["collectors"]["sleep"]["start_time"]
    try:
        assert wait_until_gone(str(tmp_path), {"sleep": (pid, start)}, 10.0) == []
        status = json.loads((tmp_path / "status.json").read_text())
        assert status["state"] == "stopped" and status["reason"].startswith("heartbeat lost"), status["reason"]
    finally:
        _remote("stop", str(tmp_path))


def _immutable(path: Path, on: bool) -> bool:
    """chattr +i / -i (root on ext4, xfs, btrfs, tmpfs ...): a file even root cannot remove."""
    return subprocess.run(["chattr", "+i" if on else "-i", str(path)], capture_output=True).returncode == 0


@pytest.mark.skipif(not shutil.which("vmstat") or not shutil.which("chattr"), reason="vmstat or chattr not installed")
def test_an_agent_directory_that_cannot_be_removed_is_said_in_meta_and_fails_the_run(busy, run):
    """The data is home and verified, but the remote directory stays: meta.json must not say the
    server was cleaned (fetch kept, removal_error, left_on_server), and the run is incomplete (exit 1)."""
    from analysis.problems import collect
    from kneeswarm import cli

    host = HostPlan(pid=busy.pid, collectors=["vmstat"])
    with open_agent(host, run, AgentSettings(interval=1, max_duration=60, heartbeat_timeout=10)) as agent:
        agent.preflight()
        agent.start()
        remote_dir = Path(agent.remote_dir)
        agent.stop()
        pinned = remote_dir / "agent.json"
        if not _immutable(pinned, True):
            pytest.skip(f"chattr +i refused on {remote_dir} (file system without immutable files)")
        try:
            agent.fetch(final=True)
            meta = agent.meta()
        finally:
            _immutable(pinned, False)
            shutil.rmtree(remote_dir, ignore_errors=True)
    assert meta["fetch"]["verified"] is True  # nothing was lost ...
    assert meta["fetch"]["kept"] is True and "agent.json" in meta["fetch"]["removal_error"]  # ... but it stayed
    assert meta["left_on_server"] == str(remote_dir)
    assert any("could not be removed" in w and str(remote_dir) in w for w in meta["warnings"])
    problems = collect({"complete": True, "ended": "completed", "hosts": {"local": meta}})
    assert not problems.complete
    assert any("left on the host" in w for w in problems.warnings)
    code, why = cli.verdict(run, {"complete": problems.complete, "ended": "completed"}, None, "completed")
    assert code == cli.EXIT_FAILED and why

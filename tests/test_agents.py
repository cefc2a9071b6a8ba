"""The agent on this machine (``local`` transport, no SSH): real pidstat, vmstat and /proc sampler.

Also: the watchdog after a SIGKILLed controller, the clock offset under libfaketime, and the
agent zipapp's verbs on their own.
"""

from __future__ import annotations

import glob
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from kneeswarm.agents import AgentError, AgentSettings, clock, open_agent, write_parsed_csvs
from kneeswarm.agents import link as link_mod
from kneeswarm.agents.bundle import write_agent_zipapp
from kneeswarm.agents.remote.defaults import SCRIPT_FILE
from kneeswarm.contracts.plan import HostPlan
from kneeswarm.contracts.rundir import RunDir

try:
    from conftest import wait_for
    from faketime_lib import faketime_prefix
    from sshd_fixture import BUSY_THREAD, REPO, busy_share, collector_pids, kernel_cpu, killed_controller, stop_proc, wait_until_gone
except ImportError:  # tests/ imported as a package
    from tests.conftest import wait_for
    from tests.faketime_lib import faketime_prefix
    from tests.sshd_fixture import BUSY_THREAD, REPO, busy_share, collector_pids, kernel_cpu, killed_controller, stop_proc, wait_until_gone

HAVE_TOOLS = shutil.which("pidstat") and shutil.which("vmstat")


@pytest.fixture
def run(tmp_path):
    return RunDir.create(tmp_path, "agents")


@pytest.mark.skipif(not HAVE_TOOLS, reason="pidstat/vmstat (sysstat, procps) not installed")
def test_local_agent_records_busy_process_and_leaves_nothing(busy, run):
    host = HostPlan(pid=busy.pid, collectors=["pidstat", "vmstat", "procfs"])  # pidstat too: listed, not by default
    with open_agent(host, run, AgentSettings(interval=1, max_duration=60, heartbeat_timeout=10)) as agent:
        facts = agent.preflight()
        assert facts["process"]["pid"] == busy.pid
        assert facts["cpu"]["logical_cpus"] >= 1 and facts["memory_total_kb"] > 0
        assert facts["tools"]["pidstat"]["version"] and facts["tools"]["vmstat"]["version"]
        assert {"pidstat", "vmstat", "procfs"} <= set(facts["collectors"])
        agent.start()
        started = kernel_cpu(busy.pid)
        remote_dir = agent.remote_dir
        pids = collector_pids(agent.start_status)
        assert {"pidstat", "vmstat"} <= set(pids)
        time.sleep(3.5)
        live = agent.fetch()  # incremental, during the run
        assert (run.raw_dir("local") / "pidstat.txt").stat().st_size > 0, live
        time.sleep(1.0)
        share = busy_share(started, kernel_cpu(busy.pid))
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
    # The spinning thread: near 100 % on a quiet machine, as little as a fifth of a core when other
    # work keeps both busy.  Against the kernel's own count for this process over the same seconds
    # (its share moves from one second to the next with the other work: within half of it).
    assert proc["cpu_pct"].median() > share / 2, (proc["cpu_pct"].tolist(), share)
    vm = pd.read_csv(run.host_dir("local") / "vmstat.csv")
    assert len(vm) >= 3 and {"r", "cs", "us", "sy", "id"} <= set(vm.columns)
    procfs = pd.read_csv(run.host_dir("local") / "process.procfs.csv")
    assert len(procfs) >= 3 and procfs["cpu_pct"].median() > share / 2, (procfs["cpu_pct"].tolist(), share)
    threads = pd.read_csv(run.host_dir("local") / "threads.csv")
    spin = threads[threads["name"] == BUSY_THREAD]
    assert spin["tid"].nunique() == 1 and spin["tid"].iloc[0] != busy.pid, threads["name"].unique()
    assert len(spin) >= 3 and spin["cpu_pct"].median() > share / 2  # the spinning thread, by its name
    meta = agent.meta()
    assert meta["clock"]["before"]["error"] < 0.01 and meta["clock"]["after"] is not None
    json.dumps(meta)  # serialisable for meta.json
    # re-running the parse from the raw dir alone, with a known offset, shifts every t
    write_parsed_csvs(run, "local", correction=2.0)
    shifted = pd.read_csv(run.host_dir("local") / "process.csv")
    assert (proc["t"] - shifted["t"]).sub(2.0).abs().max() < 0.01


@pytest.mark.skipif(not HAVE_TOOLS, reason="pidstat/vmstat (sysstat, procps) not installed")
@pytest.mark.parametrize("source,raw_name", [("pidstat", "pidstat.txt"), ("procfs", "procfs.jsonl")])
def test_live_parse_reads_only_what_each_fetch_added(busy, run, source, raw_name):
    """The live view's parse (write_parsed(live=True), every fetch of a run): a second fetch's parse
    reads only the bytes the process-table collector (pidstat's text, or the /proc sampler's lines,
    the default) wrote since the first, and its CSVs are the whole file's parse (for pidstat less
    the interval still being written)."""
    host = HostPlan(pid=busy.pid, collectors=[source, "vmstat"])
    raw = run.raw_dir("local") / raw_name
    with open_agent(host, run, AgentSettings(interval=1, max_duration=60, heartbeat_timeout=10)) as agent:
        agent.preflight()
        agent.start()
        time.sleep(2.5)
        agent.fetch()
        agent.write_parsed(live=True)
        first = agent.live_parse
        assert first is not None and first.bytes_read == raw.stat().st_size > 0
        fed = first.offset
        time.sleep(2.5)
        agent.fetch()
        stats = agent.write_parsed(live=True)
        assert agent.live_parse is first and first.bytes_read == raw.stat().st_size - fed > 0  # the new bytes only
        live = {t: pd.read_csv(run.host_dir("local") / f"{t}.csv") for t in ("process", "threads", "vmstat")}
        write_parsed_csvs(run, "local", agent.clock)  # the whole file at once, as after the final fetch
        whole = {t: pd.read_csv(run.host_dir("local") / f"{t}.csv") for t in ("process", "threads", "vmstat")}
        agent.stop()
    last = whole["process"]["t"].max() if source == "pidstat" else math.inf  # procfs holds no sample back
    assert len(live["process"]) >= 3 and stats[source]["tables"]["process"] == len(live["process"])
    for t in ("process", "threads"):
        pd.testing.assert_frame_equal(live[t], whole[t][whole[t]["t"] < last].reset_index(drop=True))
    assert (live["threads"]["name"] == BUSY_THREAD).sum() >= (3 if source == "pidstat" else 1)  # procfs: threads every 2 s
    pd.testing.assert_frame_equal(live["vmstat"], whole["vmstat"])  # one line a sample: parsed whole


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
from kneeswarm.contracts.plan import HostPlan
from kneeswarm.contracts.rundir import RunDir
from kneeswarm.agents import AgentSettings, open_agent
agent = open_agent(HostPlan(pid={pid}, collectors=["pidstat", "vmstat", "procfs"]), RunDir({run!r}), AgentSettings(interval=1, max_duration=120, heartbeat_timeout=60))
agent.preflight()
agent.start()
print(json.dumps({{"remote_dir": agent.remote_dir, "status": agent.start_status}}), flush=True)
time.sleep(120)
"""


@pytest.mark.skipif(not HAVE_TOOLS, reason="pidstat/vmstat not installed")
def test_watchdog_stops_everything_when_the_controller_is_killed(busy, run):
    code = CONTROLLER.format(repo=str(REPO), pid=busy.pid, run=str(run.path))
    with killed_controller(code, 10.0, lambda d: shutil.rmtree(d, ignore_errors=True)) as (remote_dir, left):
        assert left == []  # the heartbeat timeout is 60 s: only the closed watch channel can stop it this soon
        status = json.loads((Path(remote_dir) / "status.json").read_text())
        assert status["state"] == "stopped" and status["reason"].startswith("controller gone"), status["reason"]
        assert (Path(remote_dir) / "MANIFEST.json").exists()  # what was recorded is kept, checksummed


BURST_CODE = """
import sys, time
print("ready", flush=True)
sys.stdin.readline()
t0 = time.time()
while time.time() < t0 + 4.0:
    sum(range(10000))
print(t0, time.time(), flush=True)
sys.stdin.readline()
"""


@pytest.mark.skipif(not HAVE_TOOLS, reason="pidstat/vmstat not installed")
def test_agent_under_faketime_offset_within_its_error_and_burst_aligned(run, monkeypatch):
    """The agent's clock runs 2.5 s ahead (libfaketime); a process blocked on its stdin spins for 4 s
    and stamps its own start and end on the master's clock (this machine's, not shifted).  The
    offset measured is within its own error bound, and the samples that saw CPU are the burst's."""
    shifted = faketime_prefix(2.5)  # skips without faketime, fails when it is there but broken
    monkeypatch.setattr(link_mod, "ECHO_WRAPPER", shifted)
    monkeypatch.setattr(link_mod, "AGENT_WRAPPER", shifted)  # the agent and its collectors: +2.5 s
    burst = subprocess.Popen([sys.executable, "-c", BURST_CODE], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert burst.stdout.readline() == b"ready\n"  # started: no CPU from here until it is told to go
        host = HostPlan(pid=burst.pid, collectors=["pidstat", "vmstat", "procfs"])
        with open_agent(host, run, AgentSettings(interval=1, max_duration=60, heartbeat_timeout=10)) as agent:
            agent.preflight()
            t_called = time.time()
            agent.start()
            samples = Path(agent.remote_dir) / "procfs.jsonl"  # the sampler's file, on this machine
            wait_for(lambda: samples.exists() and samples.read_bytes().count(b"\n") >= 3, 30, "3 samples")
            burst.stdin.write(b"go\n")  # after two idle intervals
            burst.stdin.flush()
            t_start, t_end = map(float, burst.stdout.readline().split())  # the burst's own stamps
            n = samples.read_bytes().count(b"\n")
            wait_for(lambda: samples.read_bytes().count(b"\n") >= n + 2, 30, "2 samples after the burst")
            agent.stop()
            agent.fetch(final=True)
            agent.write_parsed()
    finally:
        stop_proc(burst)
    # NTP's bound: each kept round trip's offset is within half its RTT of the truth, so their median
    # is within the largest such half (clock.estimate's error); under 1 ms here on a quiet machine,
    # tens of ms when every round trip waits for a core on a machine others keep busy
    for off in (agent.clock.before, agent.clock.after):
        assert off is not None and abs(off.offset - 2.5) <= off.error + 1e-6, off
    error = max(agent.clock.before.error, agent.clock.after.error)
    raw_t = [json.loads(x)["t"] for x in (run.raw_dir("local") / "procfs.jsonl").read_text().splitlines()]
    assert raw_t[0] >= t_called + 2.5  # the host recorded on its shifted clock, after it was started
    df = pd.read_csv(run.host_dir("local") / "process.procfs.csv")  # samples stamped at interval end
    # Each sample covers (previous t, t].  /proc counts whole clock ticks (1 % of a 1 s interval) and a
    # process blocked on its stdin gets none, while a spinner gets some in any second, however small
    # its share of a core (41-63 % seen with other tests on the 2 cores): no sample outside the burst
    # saw CPU, every one wholly inside it did.  Unaligned by 2.5 s, both would fail.
    lo, hi, cpu = df["t"].shift(1).to_numpy()[1:], df["t"].to_numpy()[1:], df["cpu_pct"].to_numpy()[1:]
    shown = pd.DataFrame({"lo": lo - t_start, "hi": hi - t_start, "cpu_pct": cpu}).to_string()
    outside = (hi <= t_start - error) | (lo >= t_end + error)
    inside = (lo >= t_start + error) & (hi <= t_end - error)
    assert outside.sum() >= 2 and not (cpu[outside] > 0).any(), shown
    assert inside.sum() >= 2 and (cpu[inside] > 0).all(), shown


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


# -- the agent's zipapp on its own -----------------------------------------------------------
def _pyz(directory: Path) -> Path:
    """remote.pyz as deploy uploads it (agents/bundle.py), written into ``directory``."""
    return write_agent_zipapp(directory / SCRIPT_FILE)


def _remote(pyz: Path, *args: str, timeout: float = 30) -> dict:
    out = subprocess.run([sys.executable, "-I", "-S", str(pyz), *args], capture_output=True, text=True,
                         timeout=timeout)
    return json.loads(out.stdout)


def test_remote_max_duration_stops_the_agent_and_a_bad_command_is_reported(tmp_path):
    pyz = _pyz(tmp_path)
    cfg = {"interval": 1, "heartbeat_timeout": 60, "max_duration": 1.5,
           "collectors": [{"name": "nope", "argv": ["no-such-tool-xyz"], "raw_file": "nope.txt"},
                          {"name": "procfs", "sampler": "procfs", "params": {"pid": os.getpid(), "thread_interval": 0.5},
                           "raw_file": "procfs.jsonl", "interval": 0.25}]}
    (tmp_path / "agent.json").write_text(json.dumps(cfg))
    out = _remote(pyz, "start", str(tmp_path / "agent.json"))
    assert out["ok"]
    nope = out["status"]["collectors"]["nope"]
    assert not nope["running"] and "no-such-tool-xyz" in nope["error"]
    deadline = time.monotonic() + 8
    while (tmp_path / "agent.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["reason"].startswith("max_duration") and status["state"] == "stopped"
    lines = [json.loads(x) for x in (tmp_path / "procfs.jsonl").read_text().splitlines()]
    assert len(lines) >= 4 and {"utime", "stime", "rss_kb", "threads", "read_bytes"} <= set(lines[-1])
    # the threads every 0.5 s, the process every 0.25 s: every other line holds them, the first one
    assert [("tasks" in x) for x in lines] == [k % 2 == 0 for k in range(len(lines))]
    me = [task for task in lines[0]["tasks"] if task[0] == os.getpid()]  # the main thread's tid is the pid
    assert me and lines[0]["vol_cs"] >= me[0][5]  # the sum over the threads holds the main thread's
    stop = _remote(pyz, "stop", str(tmp_path))  # idempotent after the agent stopped itself
    assert stop["ok"] and "procfs.jsonl" in stop["manifest"]["files"]


def test_remote_preflight_reports_tools_and_topology(tmp_path):
    facts = _remote(_pyz(tmp_path), "preflight", json.dumps({"checks": {"sh": ["sh", "-c", "echo v1.2"], "gone": ["no-such-x"]},
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


def test_remote_echo_answers_each_line_with_two_timestamps(tmp_path):
    p = subprocess.Popen([sys.executable, "-I", "-S", str(_pyz(tmp_path)), "echo"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    out, _ = p.communicate(b"a\nb\n", timeout=10)
    rows = [list(map(float, line.split())) for line in out.decode().splitlines()]
    assert len(rows) == 2 and all(abs(r[0] - time.time()) < 5 and r[1] >= r[0] for r in rows)


def test_remote_heartbeat_timeout_stops_an_agent_nobody_renews(tmp_path):
    """No watch channel, no heartbeat (a network cut): the heartbeat timeout stops the agent."""
    pyz = _pyz(tmp_path)
    cfg = {"interval": 1, "heartbeat_timeout": 1.5, "max_duration": 60,
           "collectors": [{"name": "sleep", "argv": ["sleep", "60"], "raw_file": "sleep.txt"}]}
    (tmp_path / "agent.json").write_text(json.dumps(cfg))
    out = _remote(pyz, "start", str(tmp_path / "agent.json"))
    pid, start = out["status"]["collectors"]["sleep"]["pid"], out["status"]["collectors"]["sleep"]["start_time"]
    try:
        assert wait_until_gone(str(tmp_path), {"sleep": (pid, start)}, 10.0) == []
        status = json.loads((tmp_path / "status.json").read_text())
        assert status["state"] == "stopped" and status["reason"].startswith("heartbeat lost"), status["reason"]
    finally:
        _remote(pyz, "stop", str(tmp_path))


def _immutable(path: Path, on: bool) -> bool:
    """chattr +i / -i (root on ext4, xfs, btrfs, tmpfs ...): a file even root cannot remove."""
    return subprocess.run(["chattr", "+i" if on else "-i", str(path)], capture_output=True).returncode == 0


@pytest.mark.skipif(not shutil.which("vmstat") or not shutil.which("chattr"), reason="vmstat or chattr not installed")
def test_an_agent_directory_that_cannot_be_removed_is_said_in_meta_and_fails_the_run(busy, run):
    """The data is home and verified, but the remote directory stays: meta.json must not say the
    server was cleaned (fetch kept, removal_error, left_on_server), and the run is incomplete (exit 1)."""
    from kneeswarm.analysis.measure.problems import collect
    from kneeswarm.launch import cli

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


# A writer that waits for a "go" file, then appends and fsyncs CHUNKS x CHUNK_KB KiB, then says "done".
IO_WRITER = """
import os, sys, time
out, go, done, n, kb = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
while not os.path.exists(go):
    time.sleep(0.02)
fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
for _ in range(n):
    os.write(fd, b"x" * (kb * 1024)); os.fsync(fd); time.sleep(0.03)
open(done, "w").close()
time.sleep(600)
"""


def kernel_read_kb(pid: int, field: str = "read_bytes") -> float:
    """The kernel's count of what ``pid`` caused to be read from storage (/proc/PID/io read_bytes), kB;
    ``field`` "write_bytes": what it caused to be written."""
    line = next(x for x in Path(f"/proc/{pid}/io").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1]) / 1024.0


@pytest.mark.skipif(not HAVE_TOOLS, reason="pidstat/vmstat (sysstat, procps) not installed")
def test_procfs_sampler_reads_the_services_own_disk_writes(run, tmp_path):
    # The /proc sampler stands in for pidstat where it is missing; io_wait weighs the service's own
    # disk IO, so it reads /proc/PID/io as pidstat -d does.  A process writes a known 2 MiB (32 x 64
    # KiB, each fsynced) on a real disk while both sample it: the kB the sampler's rates add up to
    # are the bytes written (the kernel's page-granular write_bytes), and pidstat's agree.
    n, kb = 32, 64
    go, done = tmp_path / "go", tmp_path / "done"
    writer = subprocess.Popen([sys.executable, "-c", IO_WRITER, str(tmp_path / "w.bin"), str(go), str(done),
                               str(n), str(kb)])
    try:
        host = HostPlan(pid=writer.pid, collectors=["pidstat", "vmstat", "procfs"])
        with open_agent(host, run, AgentSettings(interval=1, max_duration=60, heartbeat_timeout=10)) as agent:
            agent.preflight()
            read0 = kernel_read_kb(writer.pid)  # the writer waits for `go` meanwhile: reads nothing
            write0 = kernel_read_kb(writer.pid, "write_bytes")
            agent.start()
            time.sleep(2.5)  # two samples before the first write
            go.touch()
            deadline = time.time() + 30
            while not done.exists() and time.time() < deadline:
                time.sleep(0.1)
            time.sleep(2.5)  # two samples after the last
            agent.stop()
            read_kb = kernel_read_kb(writer.pid) - read0  # it sleeps after `done`: reads nothing more
            kernel_written_kb = kernel_read_kb(writer.pid, "write_bytes") - write0
            agent.fetch(final=True)
            agent.write_parsed()
    finally:
        stop_proc(writer)
    assert done.exists() and (tmp_path / "w.bin").stat().st_size == n * kb * 1024
    procfs = pd.read_csv(run.host_dir("local") / "process.procfs.csv")
    dt = procfs["t"].diff()
    written_kb = (procfs["io_write_kb_s"] * dt).sum()
    # the kernel's write_bytes is the data plus what its fsyncs wrote for the file (a CI run saw 2,072 kB
    # for 2,048 of data: block and extent metadata, charged to the writer), so the sampler's sum is
    # weighed against the kernel's own delta over the run, and that against the data it must contain
    assert kernel_written_kb >= n * kb, kernel_written_kb
    assert written_kb == pytest.approx(kernel_written_kb, rel=0.001), (kernel_written_kb, procfs[["t", "io_write_kb_s"]])
    # what it read from the disk, by the kernel's counter: 0 with a warm page cache, a page or two on a
    # fresh machine (the directory's and inode's blocks of the new file; CI once saw 4 kB)
    assert (procfs["io_read_kb_s"] * dt).sum() == pytest.approx(read_kb, abs=0.5), (read_kb, procfs["io_read_kb_s"])
    pid = pd.read_csv(run.host_dir("local") / "process.csv")
    pid_kb = (pid["io_write_kb_s"] * pid["t"].diff()).sum()
    assert pid_kb == pytest.approx(written_kb, rel=0.05), pid[["t", "io_write_kb_s"]]

"""End to end over real SSH against the hosts people run inference servers on (old and minimal ones):
`kneeswarm run` monitoring the demo target on a host whose python3 is 3.6 (RHEL 8, Ubuntu 18.04),
and on one with no python3 on its PATH (a minimal container, an appliance), side by side; and a
host with neither python3 nor any collector, refused in one line.

Each "host" is one key of a private sshd on loopback whose sessions get their own PATH (a forced
command, tests/sshd_fixture.login_with_path): a directory where python3 is pyenv's 3.6, or one
holding every tool of /usr/bin except python (on an sshd without the sftp subsystem, so its files
move by sh over the exec channel).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import tomli_w

from kneeswarm.contracts.rundir import RunDir

from conftest import side_by_side, start_cli

try:
    from sshd_fixture import SSHD, keygen
except ImportError:  # tests/ imported as a package
    from tests.sshd_fixture import SSHD, keygen

pytestmark = pytest.mark.slow

HOST = "server"
STEPS, HOLD, RAMP, SETTLE = [1, 2], 3.0, 1.0, 0.5
PYTHON36 = "/root/.pyenv/versions/3.6.15/bin/python3"
TOOL_DIRS = ("/usr/bin", "/usr/sbin")
COLLECTOR_TOOLS = ("pidstat", "vmstat", "nvidia-smi")
CLOCK_TOL = 0.05  # seconds: the host is this machine, so a measured offset is all error


def tool_dir(path: Path, leave_out: tuple[str, ...] = ()) -> Path:
    """A PATH directory of links to every tool of TOOL_DIRS except python* and ``leave_out``."""
    path.mkdir()
    for d in TOOL_DIRS:
        for name in os.listdir(d):
            if name.startswith("python") or name in leave_out or (path / name).exists():
                continue
            (path / name).symlink_to(os.path.join(d, name))
    return path


def write_plan(path: Path, url: str, pid: int, host: dict) -> Path:
    plan = {"name": path.stem, "target": url,
            "load": {"steps": STEPS, "hold": HOLD, "ramp": RAMP, "settle": SETTLE, "workers": 1},
            "monitor": {"interval": 1},
            "hosts": [{"name": HOST, "pid": pid, **host}]}
    path.write_text(tomli_w.dumps(plan))
    return path


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    if not os.path.exists(PYTHON36):
        pytest.skip(f"{PYTHON36} is not installed (pyenv install 3.6.15)")
    tmp = tmp_path_factory.mktemp("e2e_hosts")
    server = SSHD.start(tmp / "sshd")
    no_sftp = SSHD.start(tmp / "sshd-exec", sftp=False)  # an appliance: no sftp subsystem either
    py36 = tmp / "path-py36"
    py36.mkdir()
    (py36 / "python3").symlink_to(PYTHON36)
    paths = {"py36": f"{py36}:/usr/bin:/bin", "nopython": str(tool_dir(tmp / "path-nopython")),
             "bare": str(tool_dir(tmp / "path-bare", COLLECTOR_TOOLS))}
    known_hosts = tmp / "known_hosts"
    known_hosts.write_text(server.known_hosts_line() + no_sftp.known_hosts_line())
    out = {}
    for name, path in paths.items():
        key = keygen(tmp / f"key-{name}")
        sshd = no_sftp if name == "nopython" else server
        sshd.authorize(key, path=path)
        out[name] = {"ssh": sshd.target, "key_file": str(key), "known_hosts": str(known_hosts)}
    try:
        yield tmp, out
    finally:
        server.stop()
        no_sftp.stop()


@pytest.fixture(scope="module")
def runs(hosts):
    from kneeswarm.launch.cli import start_target, stop_target

    tmp, host = hosts
    targets = {name: start_target(["--mode", "knee", "--slots", "4", "--service-ms", "20"])
               for name in ("py36", "nopython", "bare")}
    try:
        plans = {name: write_plan(tmp / f"{name}.toml", url, proc.pid, host[name])
                 for name, (proc, url) in targets.items()}
        with side_by_side() as started:
            for name, plan in plans.items():
                started[name] = start_cli("run", str(plan), "--out", str(tmp / "out" / name), "-q")
            done = {name: p.communicate(timeout=240) for name, p in started.items()}
    finally:
        for proc, _ in targets.values():
            stop_target(proc)
    return {name: (subprocess.CompletedProcess(started[name].args, started[name].returncode, *done[name]),
                   tmp / "out" / name, targets[name][0].pid) for name in started}


def only(out: Path) -> RunDir:
    dirs = sorted(p for p in out.iterdir() if p.is_dir())
    assert len(dirs) == 1, dirs
    return RunDir(dirs[0])


def server_metrics_every_step(run: RunDir, pid: int) -> dict[str, list[int]]:
    """Samples of the monitored process (/proc sampler or pidstat) and of the host (vmstat) in each step's window."""
    out = {}
    for table in ("process", "vmstat"):
        df = run.read_host_csv(HOST, table)
        assert df is not None and len(df), f"no hosts/{HOST}/{table}.csv"
        if table == "process":
            assert df["pid"].eq(pid).all(), df["pid"].unique()
        out[table] = [int(((df.t >= st.t_ramp) & (df.t <= st.t_end)).sum()) for _, st in run.read_steps().iterrows()]
    return out


def _common(res: subprocess.CompletedProcess, out: Path, pid: int) -> tuple[RunDir, dict]:
    assert res.returncode == 0, res.stderr[-3000:]
    run = only(out)
    meta = run.read_meta()
    h = meta["hosts"][HOST]
    assert h["transport"] == "ssh" and h["fetch"]["verified"] is True and h["complete"] is True, h
    assert h["clock"]["before"] is not None and h["clock"]["after"] is not None, h["clock"]
    for when in ("before", "after"):  # one machine: the true offset is 0
        assert abs(h["clock"][when]["offset"]) < CLOCK_TOL, h["clock"]
    counts = server_metrics_every_step(run, pid)
    assert len(run.read_steps()) == len(STEPS)
    for table, per_step in counts.items():
        assert all(n >= 2 for n in per_step), (table, per_step)  # >= 2 one-second samples in each step
    assert not (Path.home() / h["remote_dir"]).exists()  # removed after the checksums matched
    return run, h


def test_a_host_whose_python3_is_3_6_is_monitored_by_the_python_agent(runs):
    res, out, pid = runs["py36"]
    run, h = _common(res, out, pid)
    assert h["agent"]["kind"] == "python" and h["agent"]["python"] == "3.6", h["agent"]
    assert h["facts"]["python"].startswith("3.6.")
    log = (run.raw_dir(HOST) / "agent.log").read_text()
    assert " python 3.6." in log, log[:300]  # the daemon's own first line names its interpreter
    assert h["collectors"]["procfs"]["enabled"] and h["collectors"]["vmstat"]["enabled"]


def test_a_host_without_python3_is_monitored_by_the_shell_agent_and_says_what_it_lost(runs):
    res, out, pid = runs["nopython"]
    run, h = _common(res, out, pid)
    agent = h["agent"]
    assert agent["kind"] == "shell" and "python3 is not on the host's PATH" in agent["why"], agent
    assert "procfs" in agent["lost"] and h["facts"]["python"] is None
    assert h["transfer"] == "exec"  # no sftp subsystem: files moved by sh over the exec channel
    assert (run.raw_dir(HOST) / "remote.sh").exists() is False  # the script is not fetched; its output is
    assert (run.raw_dir(HOST) / "pidstat.txt").stat().st_size > 0 and (run.raw_dir(HOST) / "vmstat.txt").stat().st_size > 0
    note = [w for w in h["warnings"] if w.startswith("ran without the python agent")]
    assert note and "procfs" in note[0], h["warnings"]
    md = (run.path / "report" / "summary.md").read_text()
    assert "ran without the python agent" in md


def test_a_host_with_neither_python3_nor_a_collector_is_one_line_exit_2(runs):
    res, out, _ = runs["bare"]
    assert res.returncode == 2, res.stderr[-2000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert "python3 is not on the host's PATH" in lines[0] and all(t in lines[0] for t in COLLECTOR_TOOLS), lines[0]
    assert not out.exists() or not any(p.is_dir() for p in out.iterdir())  # no run directory left behind

"""End to end over real SSH: `kneeswarm run` with a [[hosts]] entry `ssh = "root@127.0.0.1:PORT"`
of a real sshd on loopback (tests/sshd_fixture.py) monitoring the demo target's pid, against the
same run on the local path.

- the SSH path gives the same per-step server data as the local path (within noise);
- an unknown host key fails the run with exit code 2 and the fingerprint in one line, and
  `--accept-new-host-keys` (from the CLI down to the agent) lets the same run through;
- meta.json carries the SSH host's facts and clock offsets;
- the SSH connection dropped mid-run: the run goes on, the final fetch gets every sample, and
  meta.json says what happened.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import tomli_w

from kneeswarm.contracts.rundir import RunDir

from conftest import read_summary, run_cli, wait_for

try:
    from sshd_fixture import sshd  # noqa: F401 (the fixture)
except ImportError:  # tests/ imported as a package
    from tests.sshd_fixture import sshd  # noqa: F401

pytestmark = pytest.mark.slow

HOST = "server"
STEPS, HOLD, RAMP, SETTLE = [1, 2, 4], 4.0, 1.0, 1.0
CPU_TOL_POINTS, CPU_TOL_REL = 15.0, 0.30  # process cpu_pct per step: within max(points, rel)
VM_TOL_POINTS, VM_TOL_REL = 20.0, 0.50  # vmstat us/sy per step (host-wide: other processes add noise)
CS_TOL_REL, CS_TOL_ABS = 0.60, 3000.0  # vmstat cs per step


def write_plan(path: Path, url: str, pid: int, host: dict, steps: list[int] = STEPS, hold: float = HOLD) -> Path:
    plan = {
        "name": path.stem, "target": url,
        "load": {"steps": steps, "hold": hold, "ramp": RAMP, "settle": SETTLE, "workers": 1},
        "hosts": [{"name": HOST, "pid": pid, **host}],
    }
    path.write_text(tomli_w.dumps(plan))
    return path


def ssh_host(sshd, known_hosts: Path) -> dict:
    return {"ssh": sshd.target, "key_file": str(sshd.user_key), "known_hosts": str(known_hosts)}


def run_dirs(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if p.is_dir()) if out.exists() else []


@pytest.fixture(scope="module")
def runs(sshd, tmp_path_factory):  # noqa: F811 (the sshd fixture)
    """The SSH run refused (unknown key); then the SSH run with the flag and the local run side by
    side, each monitoring its own demo target (the same kind, under the same plan), so both see
    the same machine at the same time."""
    import subprocess

    from conftest import side_by_side, start_cli
    from kneeswarm.launch.cli import start_target, stop_target

    tmp = tmp_path_factory.mktemp("e2e_ssh")
    known_hosts = tmp / "known_hosts"  # empty: the sshd's key is unknown
    known_hosts.write_text("")
    targets = [start_target(["--mode", "knee", "--slots", "4", "--service-ms", "20"]) for _ in range(2)]
    (proc, url), (local_proc, local_url) = targets
    try:
        ssh_plan = write_plan(tmp / "ssh.toml", url, proc.pid, ssh_host(sshd, known_hosts))
        local_plan = write_plan(tmp / "local.toml", local_url, local_proc.pid, {})
        refused = run_cli("run", str(ssh_plan), "--out", str(tmp / "refused"), "-q", timeout=120)
        refused_dirs = run_dirs(tmp / "refused")
        with side_by_side() as started:
            started["ssh"] = start_cli("run", str(ssh_plan), "--accept-new-host-keys", "--out", str(tmp / "ssh"), "-q")
            started["local"] = start_cli("run", str(local_plan), "--out", str(tmp / "local"), "-q")
            done = {name: p.communicate(timeout=240) for name, p in started.items()}
    finally:
        for target, _ in targets:
            stop_target(target)
    accepted, local = (subprocess.CompletedProcess(p.args, p.returncode, *done[name]) for name, p in started.items())
    return {"refused": refused, "refused_dirs": refused_dirs, "ssh": accepted, "local": local, "tmp": tmp,
            "known_hosts": known_hosts, "pid": proc.pid}


def only(out: Path) -> RunDir:
    dirs = run_dirs(out)
    assert len(dirs) == 1, dirs
    return RunDir(dirs[0])


def per_step(run: RunDir, table: str, column: str) -> list[tuple[int, float]]:
    """(samples, median) of a host column per step's steady window (the median: host-wide series
    such as vmstat us carry one-second spikes from whatever else runs on a shared machine)."""
    df = run.read_host_csv(HOST, table)
    assert df is not None, f"no hosts/{HOST}/{table}.csv"
    out = []
    for _, st in run.read_steps().iterrows():
        win = df[(df.t >= st.t_steady + SETTLE) & (df.t <= st.t_end)][column]
        out.append((len(win), float(win.median()) if len(win) else float("nan")))
    return out


def test_unknown_host_key_fails_the_run_with_its_fingerprint(runs, sshd):  # noqa: F811
    res = runs["refused"]
    assert res.returncode == 2, res.stderr[-2000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("kneeswarm: error:")]
    assert len(lines) == 1, res.stderr[-2000:]
    assert sshd.fingerprint() in lines[0] and "--accept-new-host-keys" in lines[0]
    assert "Traceback" not in res.stderr
    assert runs["refused_dirs"] == []  # nothing was recorded: no half run left behind


def test_accept_new_host_keys_flows_from_the_cli_to_the_agent(runs, sshd):  # noqa: F811
    res = runs["ssh"]
    assert res.returncode == 0, res.stderr[-3000:]
    text = runs["known_hosts"].read_text()
    assert text.count("\n") == 1 and sshd.host_key_name in text  # recorded once
    run = only(runs["tmp"] / "ssh")
    assert read_summary(run.path)["complete"] is True


def test_meta_carries_the_ssh_hosts_facts_and_clock(runs, sshd):  # noqa: F811
    meta = only(runs["tmp"] / "ssh").read_meta()
    h = meta["hosts"][HOST]
    assert h["transport"] == "ssh" and h["ssh"] == sshd.target and h["pid"] == runs["pid"]
    facts = h["facts"]
    assert facts["python"].startswith("3.") and facts["process"]["pid"] == runs["pid"]
    assert facts["cpu"]["logical_cpus"] >= 1 and facts["memory_total_kb"] > 0
    assert h["collectors"]["procfs"]["enabled"] and h["collectors"]["vmstat"]["enabled"]
    for when in ("before", "after"):
        c = h["clock"][when]
        assert c is not None and abs(c["offset"]) < 0.05 and c["error"] < 0.05, h["clock"]
    assert h["fetch"]["verified"] is True
    assert meta["hosts_preflight"][HOST]["process"]["pid"] == runs["pid"]
    assert meta["complete"] is True
    assert all(" skipped: " in w for w in meta["warnings"]), meta["warnings"]  # e.g. no GPU here; nothing else


def test_ssh_path_gives_the_same_per_step_server_metrics_as_local(runs):
    assert runs["ssh"].returncode == 0, runs["ssh"].stderr[-3000:]
    assert runs["local"].returncode == 0, runs["local"].stderr[-3000:]
    ssh, local = only(runs["tmp"] / "ssh"), only(runs["tmp"] / "local")
    assert ssh.read_meta()["hosts"][HOST]["transport"] == "ssh"
    assert local.read_meta()["hosts"][HOST]["transport"] == "local"
    min_samples = int(HOLD - SETTLE) - 1
    report = []
    for table, column, tol in (("process", "cpu_pct", (CPU_TOL_POINTS, CPU_TOL_REL)),
                               ("vmstat", "us", (VM_TOL_POINTS, VM_TOL_REL)),
                               ("vmstat", "sy", (VM_TOL_POINTS, VM_TOL_REL)),
                               ("vmstat", "cs", (CS_TOL_ABS, CS_TOL_REL))):
        a, b = per_step(ssh, table, column), per_step(local, table, column)
        report.append((table, column, a, b))
        for i, ((na, ma), (nb, mb)) in enumerate(zip(a, b)):
            assert na >= min_samples and nb >= min_samples, (table, column, i, a, b)
            limit = max(tol[0], tol[1] * max(abs(ma), abs(mb)))
            assert abs(ma - mb) <= limit, f"{table}.{column} step {i}: ssh {ma:.1f} vs local {mb:.1f} (> {limit:.1f})"
    print(json.dumps(report))
    # The process is really loaded by the steps (the comparison is not between two idle series).
    cpu = per_step(local, "process", "cpu_pct")
    assert cpu[-1][1] > cpu[0][1]


def _sshd_sessions(sshd) -> list[psutil.Process]:  # noqa: F811
    try:
        return [p for p in psutil.Process(sshd.proc.pid).children() if "sshd" in p.name()]
    except psutil.Error:
        return []


@pytest.mark.long
def test_ssh_dropped_mid_run_the_run_goes_on_and_nothing_is_lost(sshd, tmp_path, start_demo_target):  # noqa: F811
    import subprocess
    import sys

    from conftest import REPO

    target = start_demo_target("--mode", "knee", "--slots", "4", "--service-ms", "20")
    known_hosts = sshd.write_known_hosts(tmp_path / "known_hosts")
    plan = write_plan(tmp_path / "drop.toml", target.url, target.pid, ssh_host(sshd, known_hosts),
                      steps=[1, 2], hold=6.0)
    out = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "kneeswarm.launch.cli", "run", str(plan), "--out", str(out), "-q"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: any(out.glob("*/requests/part-*.parquet")) or proc.poll() is not None, 90,
                 "the first request rows")
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(2.0)
        dropped = _sshd_sessions(sshd)
        assert dropped, "no SSH session to drop"
        for p in dropped:  # the connections die; the detached agent on the server keeps recording
            p.kill()
        dropped_at = time.time()
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    run = only(out)
    meta = run.read_meta()
    h = meta["hosts"][HOST]
    assert meta["complete"] is True and h["fetch"]["verified"] is True
    assert h["reconnects"] >= 1, h
    assert any(w.startswith(f"{HOST}: ") and ("connection lost" in w or "postponed" in w) for w in meta["warnings"]), \
        meta["warnings"]
    steps = run.read_steps()
    for table in ("vmstat", "process"):
        df = run.read_host_csv(HOST, table)
        t = df["t"].to_numpy()
        t = t[(t >= steps["t_ramp"].min()) & (t <= steps["t_end"].max())]
        assert t.min() <= steps["t_ramp"].min() + 1.5 and t.max() >= steps["t_end"].max() - 1.5, table
        assert np.diff(t).max() < 2.5, f"{table}: a gap of {np.diff(t).max():.1f}s around the drop at {dropped_at:.0f}"

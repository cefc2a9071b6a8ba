"""`kneeswarm run --worker-hosts` against a real sshd on loopback: workers start over SSH, run,
and are gone afterwards; a host whose versions differ is refused with one line and exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kneeswarm.launch.conductor import free_port
from kneeswarm.contracts.rundir import RunDir

from conftest import REPO, wait_for

try:
    from sshd_fixture import processes_mentioning, sshd  # noqa: F401 (the fixture)
except ImportError:  # tests/ imported as a package
    from tests.sshd_fixture import processes_mentioning, sshd  # noqa: F401

pytestmark = pytest.mark.slow

WORKER_COMMAND = f"env PYTHONPATH={REPO} {sys.executable} -m kneeswarm.launch.cli"


def _run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kneeswarm.launch.cli", "run", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


@pytest.mark.long
def test_worker_hosts_start_run_and_leave_nothing(sshd, tmp_path, start_demo_target):
    target = start_demo_target("--mode", "knee", "--slots", "2", "--service-ms", "20")
    kh = sshd.write_known_hosts(tmp_path / "known_hosts")
    port = free_port()
    res = _run("--target", target.url, "--steps", "1,2", "--hold", "3", "--ramp", "0.5", "--settle", "0.5",
               "--worker-hosts", f"{sshd.target}/2", "--worker-command", WORKER_COMMAND,
               "--worker-key-file", str(sshd.user_key), "--worker-known-hosts", str(kh),
               "--master-port", str(port), "--out", str(tmp_path / "runs"), "-q")
    assert res.returncode == 0, res.stderr[-2000:]
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    rows = RunDir(run_dir).read_requests()
    assert set(rows["worker"]) == {"worker-0", "worker-1"}  # the two processes of the one worker host
    meta = RunDir(run_dir).read_meta()
    assert not [w for w in meta["warnings"] if "worker host" in w]  # stopped, and checked gone, over SSH
    # no worker left running (exec: locust's argv), within a second of the run's end
    wait_for(lambda: processes_mentioning(f"--master-port {port}") == [], 1.0, "the worker processes to be gone")


def test_worker_hosts_with_other_versions_are_refused(sshd, tmp_path, start_demo_target):
    target = start_demo_target("--mode", "knee", "--slots", "2", "--service-ms", "20")
    kh = sshd.write_known_hosts(tmp_path / "known_hosts")
    fake = tmp_path / "old_kneeswarm.py"
    fake.write_text('import json; print(json.dumps({"kneeswarm": "0.0.1", "locust": "2.20.0"}))\n')
    res = _run("--target", target.url, "--steps", "1", "--hold", "2", "--settle", "0.5",
               "--worker-hosts", sshd.target, "--worker-command", f"{sys.executable} {fake}",
               "--worker-key-file", str(sshd.user_key), "--worker-known-hosts", str(kh), "--out", str(tmp_path / "runs"))
    assert res.returncode == 2
    (line,) = res.stderr.strip().splitlines()
    assert "versions differ" in line and "kneeswarm 0.0.1" in line and "locust 2.20.0" in line
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # no run directory


def test_worker_hosts_unknown_host_key_is_refused(sshd, tmp_path, start_demo_target):
    target = start_demo_target("--mode", "knee", "--slots", "2", "--service-ms", "20")
    res = _run("--target", target.url, "--steps", "1", "--hold", "2", "--settle", "0.5",
               "--worker-hosts", sshd.target, "--worker-command", WORKER_COMMAND, "--worker-key-file",
               str(sshd.user_key), "--worker-known-hosts", str(tmp_path / "empty_known_hosts"),
               "--out", str(tmp_path / "runs"))
    assert res.returncode == 2
    assert sshd.fingerprint() in res.stderr  # refused with the fingerprint to check

"""Failures reach the exit code and meta.json, and nothing of a run outlives its controller.

Everything here goes through the real console script (the `kneeswarm` the venv installed, with
this tree first on PYTHONPATH), real Locust processes and the real demo target.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import REPO, wait_for

pytestmark = pytest.mark.slow

KNEESWARM = str(Path(sys.executable).with_name("kneeswarm"))
ORPHAN_WAIT = 10.0  # seconds after the kill by which nothing of the run may remain


def kneeswarm_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def console(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """The installed console script, run to the end."""
    return subprocess.run([KNEESWARM, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env=kneeswarm_env())


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def run_processes(root: psutil.Process) -> dict[str, list[psutil.Process]]:
    """The Locust processes and the demo target among ``root``'s descendants, by role."""
    roles: dict[str, list[psutil.Process]] = {"master": [], "worker": [], "target": []}
    for p in root.children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.NoSuchProcess:
            continue
        if "-m locust" in cmd:
            roles["worker" if "--worker" in cmd else "master"].append(p)
        elif "kneeswarm.target" in cmd:
            roles["target"].append(p)
    return roles


def test_kill_9_of_demo_leaves_no_locust_and_no_target(tmp_path):
    """kill -9 of `kneeswarm demo` mid-step: its master, workers and target are gone within 10 s."""
    out = tmp_path / "runs"
    proc = subprocess.Popen([KNEESWARM, "demo", "--out", str(out), "--steps", "1,2", "--hold", "60"],
                            cwd=REPO, env=kneeswarm_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    started: list[psutil.Process] = []
    try:
        wait_for(lambda: any(out.glob("*/requests/part-*.parquet")) or proc.poll() is not None, 120,
                 "the first request rows")
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        roles = run_processes(psutil.Process(proc.pid))
        assert len(roles["master"]) == 1 and len(roles["worker"]) >= 1 and len(roles["target"]) == 1, roles
        started = [p for ps in roles.values() for p in ps]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + ORPHAN_WAIT
        while time.monotonic() < deadline and any(alive(p) for p in started):
            time.sleep(0.2)
        left = [(p.pid, " ".join(p.cmdline())[:120]) for p in started if alive(p)]
        assert left == [], f"still running {ORPHAN_WAIT:g}s after the kill: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in started:  # never leave a failed test's leftovers behind
            if alive(p):
                p.kill()
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    res = console("analyze", str(run_dir), timeout=120)
    assert res.returncode in (0, 1), res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    assert (run_dir / "report" / "summary.json").exists()

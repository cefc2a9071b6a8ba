"""Workers on other machines: `kneeswarm run --workers 0 --expect-workers N` and `kneeswarm worker`,
as real processes on loopback (a worker's machine is only its own process here)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from kneeswarm.conductor import free_port
from kneeswarm.rundir import RunDir

from conftest import REPO, wait_for

pytestmark = pytest.mark.slow

REPORT_INTERVAL = 3.0  # locust.runners.WORKER_REPORT_INTERVAL: what a killed worker may not have sent


def _cli(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "kneeswarm.cli", *args], env=env, text=True,
                            start_new_session=True, **kw)


def _worker(port: int, log) -> subprocess.Popen:
    return _cli("worker", "--master", f"127.0.0.1:{port}", stdout=log, stderr=subprocess.STDOUT)


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_run_names_how_many_workers_came(tmp_path, start_demo_target):
    target = start_demo_target("--mode", "knee", "--slots", "2", "--service-ms", "20")
    port = free_port()
    log = (tmp_path / "worker.log").open("w")
    run = _cli("run", "--target", target.url, "--steps", "1", "--hold", "2", "--ramp", "0.5", "--settle", "0.5", "--workers", "0",
               "--expect-workers", "2", "--expect-workers-wait", "6", "--master-port", str(port), "--out",
               str(tmp_path / "runs"), "-q", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(2)
    w = _worker(port, log)
    try:
        _, err = run.communicate(timeout=180)
    finally:
        _stop(w)
    assert run.returncode == 1, err
    assert "only 1 of 2 workers connected within 6s" in err


def test_a_worker_killed_mid_step_the_run_goes_on(tmp_path, start_demo_target):
    target = start_demo_target("--mode", "knee", "--slots", "4", "--service-ms", "20")
    port, out = free_port(), tmp_path / "runs"
    logs = [(tmp_path / f"worker-{i}.log").open("w") for i in range(2)]
    run = _cli("run", "--target", target.url, "--steps", "2,4,6", "--hold", "8", "--ramp", "0.5", "--settle", "0.5",
               "--workers", "0", "--expect-workers", "2", "--master-port", str(port), "--out", str(out), "-q",
               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    workers = [_worker(port, logs[i]) for i in range(2)]
    try:
        def step_1_running() -> bool:
            steps = list(out.glob("*/steps.csv"))
            return bool(steps) and len(RunDir(steps[0].parent).read_steps()) >= 2

        wait_for(lambda: step_1_running() or run.poll() is not None, 120, "step 1")
        assert run.poll() is None, run.communicate()[1]
        time.sleep(3)
        t_kill = time.time()
        os.killpg(workers[1].pid, signal.SIGKILL)
        _, err = run.communicate(timeout=240)
    finally:
        for w in workers:
            _stop(w)
        if run.poll() is None:
            _stop(run)
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    meta = RunDir(run_dir).read_meta()
    assert meta["ended"] == "completed", err
    steps = RunDir(run_dir).read_steps()
    assert len(steps) == 3 and steps["t_end"].notna().all()  # the run completed on the other worker
    (lost,) = meta["workers_lost"]
    assert lost["step"] == 1 and t_kill - 1 <= lost["t"] <= t_kill + 30
    assert any(lost["worker"] in w and "step 1" in w for w in meta["warnings"])
    rows = RunDir(run_dir).read_requests()
    by_worker = rows.groupby("worker")["t_start"].agg(["max", "count"])
    assert set(by_worker.index) == {"worker-0", "worker-1"}
    killed = by_worker.loc[lost["worker"]]
    survivor = by_worker.drop(lost["worker"]).iloc[0]
    # every report the killed worker sent is in the run: its rows reach to within one report interval
    # (plus a second of slack) of the kill, and none come after it
    assert t_kill - REPORT_INTERVAL - 1.5 <= killed["max"] <= t_kill
    assert survivor["max"] > t_kill + 8  # the survivor carried step 2
    assert (rows[rows["worker"] == lost["worker"]]["step"] == 2).sum() == 0

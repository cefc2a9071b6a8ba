"""Workers on other machines: `kneeswarm run --workers 0 --expect-workers N` and `kneeswarm worker`,
as real processes on loopback (a worker's machine is only its own process here)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import requests

from kneeswarm.launch.conductor import free_port
from kneeswarm.contracts.rundir import RunDir

from conftest import REPO, read_summary, wait_for

pytestmark = pytest.mark.slow

REPORT_INTERVAL = 3.0  # locust.runners.WORKER_REPORT_INTERVAL: what a killed worker may not have sent
SERVED = 'kneeswarm_target_requests_total{code="200"}'  # the demo target's own count of answered inferences
PREFLIGHT_SLACK = 20  # inferences the conductor's target check may send before the load


def served(url: str) -> float:
    """The demo target's count of inferences answered 200 (its /metrics)."""
    for line in requests.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(SERVED + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{SERVED} not in the target's /metrics")


def check_worker_table(run_dir) -> dict:
    """summary.json's per-worker table against numpy on the stored rows and generator CSVs, over
    each step's steady window [t_steady + settle, t_end) from steps.csv; returns the summary."""
    s = read_summary(run_dir)
    rd = RunDir(run_dir)
    rows, steps = rd.read_requests(), rd.read_steps()
    t, step, worker = rows["t_start"].to_numpy(float), rows["step"].to_numpy(float), rows["worker"].to_numpy(str)
    assert sum(w["requests"] for w in s["workers"].values()) == len(rows)
    for name, tot in s["workers"].items():
        assert tot["requests"] == int((worker == name).sum())
    settle = s["analysis"]["settle"]
    for i, st in enumerate(s["steps"]):
        lo, hi = float(steps["t_steady"][i]) + settle, float(steps["t_end"][i])
        in_step = (t >= lo) & (t < hi) & (step == steps["index"][i])
        want = {w: int((in_step & (worker == w)).sum()) for w in np.unique(worker)}
        got = {w: c["requests"] for w, c in st["workers"].items()}
        assert got == want, (i, got, want)
        assert sum(got.values()) == st["requests"]
        for w, cell in st["workers"].items():
            assert cell["rps"] == pytest.approx(want[w] / (hi - lo))
            gen = pd.read_csv(run_dir / "generator" / f"{w}.csv")
            g = gen[(gen["t"] >= lo) & (gen["t"] < hi)]
            if len(g):
                assert cell["cpu_pct"] == pytest.approx(g["cpu_pct"].mean())
                assert cell["rss_mb"] == pytest.approx(g["rss_mb"].max())
                assert cell["users"] == pytest.approx(g["users"].mean())
            else:
                assert "cpu_pct" not in cell
    md = (run_dir / "report" / "summary.md").read_text()
    html = (run_dir / "report" / "index.html").read_text()
    for name in s["workers"]:
        assert f"| {name} | {s['workers'][name]['requests']:,} |" in md
        assert f"<td>{name}</td><td>{s['workers'][name]['requests']:,}</td>" in html
    return s


def _cli(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "kneeswarm.launch.cli", *args], env=env, text=True,
                            start_new_session=True, **kw)


def _worker(port: int, log) -> subprocess.Popen:
    return _cli("worker", "--master", f"127.0.0.1:{port}", stdout=log, stderr=subprocess.STDOUT)


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


FEW_WORKERS_TEST = "test_run_names_how_many_workers_came"


@pytest.fixture(scope="module", autouse=True)
def few_workers_run(request, tmp_path_factory):
    """The run of FEW_WORKERS_TEST (2 workers expected, 1 comes 2 s after the start), started with
    this module when that test is selected, so that its waiting goes while the lost-worker test
    runs; that test (last in the file) collects it."""
    import threading

    from kneeswarm.launch.cli import start_target, stop_target

    if not any(item.name == FEW_WORKERS_TEST for item in request.session.items if item.module is request.module):
        yield None
        return
    tmp = tmp_path_factory.mktemp("few_workers")
    target, url = start_target(["--mode", "knee", "--slots", "2", "--service-ms", "20"])
    port = free_port()
    log, stderr = (tmp / "worker.log").open("w"), tmp / "stderr.txt"
    with stderr.open("w") as e:
        run = _cli("run", "--target", url, "--steps", "1", "--hold", "2", "--ramp", "0.5", "--settle", "0.5",
                   "--workers", "0", "--expect-workers", "2", "--expect-workers-wait", "6", "--master-port", str(port),
                   "--out", str(tmp / "runs"), "-q", stdout=subprocess.DEVNULL, stderr=e)
    workers: list[subprocess.Popen] = []
    later = threading.Timer(2, lambda: workers.append(_worker(port, log)))
    later.start()
    try:
        yield run, stderr
    finally:
        later.cancel()
        later.join()
        for w in workers:
            _stop(w)
        _stop(run)
        stop_target(target)


@pytest.mark.long
def test_a_worker_killed_mid_step_the_run_goes_on(tmp_path, start_demo_target):
    """kill -9 of one of two workers during step 1: the run completes on the other; step 1 (only)
    is flagged with the time and the worker; every row the killed worker sent is kept (the demo
    target's own count of answered requests exceeds the rows by no more than what one report
    interval of the killed worker could hold); the per-worker table matches the rows."""
    target = start_demo_target("--mode", "knee", "--slots", "4", "--service-ms", "20")
    served_before = served(target.url)
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
    assert t_kill - REPORT_INTERVAL <= lost["t_last_heard"] <= t_kill + 1.5 and lost["workers_before"] == 2
    assert t_kill - REPORT_INTERVAL - 1.5 <= lost["t_last_report"] <= t_kill
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
    # no row sent before the kill is lost: what the target answered and no row records is at most
    # the killed worker's unreported tail (one report interval and a little) and the preflight
    mine = rows[(rows["worker"] == lost["worker"]) & (rows["step"] == 1)]["t_start"]
    rate = len(mine) / float(mine.max() - mine.min())
    missing = served(target.url) - served_before - int(rows["ok"].sum())
    assert 0 <= missing <= rate * (REPORT_INTERVAL + 1.5) + PREFLIGHT_SLACK, (missing, rate)
    # the affected step, and only it, is flagged with the worker, the time and the workers left
    s = check_worker_table(run_dir)
    flag = [r for r in s["steps"][1]["reasons"] if f"worker {lost['worker']} lost at" in r]
    clock, missing_at = (time.strftime("%H:%M:%S", time.gmtime(lost[k])) for k in ("t_last_heard", "t"))
    assert len(flag) == 1 and f"lost at {clock}Z" in flag[0] and f"declared missing at {missing_at}Z" in flag[0]
    assert "1 of 2 workers" in flag[0], flag
    assert s["steps"][1]["valid"] is False
    assert not any("lost at" in r for i in (0, 2) for r in s["steps"][i]["reasons"])
    assert s["workers"][lost["worker"]]["lost"]["step"] == 1
    md = (run_dir / "report" / "summary.md").read_text()
    assert flag[0] in md.replace("\\", "") and f"lost at {clock}Z in step 1" in md


@pytest.mark.long
def test_a_search_with_workers_on_other_machines_locates_the_knee(tmp_path, start_demo_target):
    """mode = "search" with `kneeswarm run --workers 0` and two `kneeswarm worker` processes (workers on
    other machines): the master chooses each probe from both workers' rows as they arrive; the knee
    target's K = 6 slots of 200 ms are the truth (min(N, 6) x 5 req/s: the knee is 6 users).  Both
    workers carry every probe, and the knee lands within max(1, 10 %) of K.  From 4 users, held 10 s
    at most (CI's whole run must fit in 45 minutes): probes of 1 and 2 users (~19 s each, their 50 rows slow to
    come) only showed growth before the knee, and a probe can end no sooner than settle + 4 s of rows
    + the 0-3 s they trail by (the least of the two workers' watermarks), so max_hold sets each probe's
    length (tests/test_search_runs.py)."""
    slots = 6
    target = start_demo_target("--mode", "knee", "--slots", str(slots), "--service-ms", "200")
    plan = tmp_path / "search.toml"
    plan.write_text('[load]\nmode = "search"\nstart = 4\nmax = 64\nhold = "auto"\nmin_hold = 3\nmax_hold = 10\n'
                    'settle = 0\nramp = 0.5\n')
    port, out = free_port(), tmp_path / "runs"
    logs = [(tmp_path / f"worker-{i}.log").open("w") for i in range(2)]
    run = _cli("run", str(plan), "--target", target.url, "--workers", "0", "--expect-workers", "2",
               "--master-port", str(port), "--out", str(out), "-q", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    workers = [_worker(port, logs[i]) for i in range(2)]
    try:
        _, err = run.communicate(timeout=400)
    finally:
        for w in workers:
            _stop(w)
        _stop(run)
    assert run.returncode == 0, err[-3000:]
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    s = read_summary(run_dir)["search"]
    users = [pr["users"] for pr in s["probes"]]
    print(users, s["knee_bracket"], s["stopped_because"], s["load_s"])
    lo, hi = s["knee_bracket"]
    assert abs(lo - slots) <= max(1, 0.1 * slots) and hi - lo <= 1, s
    assert users[:2] == [4, 8] and max(users) == 8, users  # growth stops at the first saturated probe
    rows = RunDir(run_dir).read_requests()
    steps = RunDir(run_dir).read_steps()
    assert list(steps["users"]) == users
    for _, st in steps.iterrows():  # each probe carried by both workers
        mine = rows[rows["step"] == st["index"]]
        assert set(mine["worker"]) == {"worker-0", "worker-1"}, (st["users"], mine["worker"].value_counts())


def test_run_names_how_many_workers_came(few_workers_run):
    run, stderr = few_workers_run
    run.wait(timeout=180)
    err = stderr.read_text()
    assert run.returncode == 1, err
    assert "only 1 of 2 workers connected within 6s" in err

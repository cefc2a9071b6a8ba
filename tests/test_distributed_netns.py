"""Multi-host in network namespaces the test creates: the master (`kneeswarm run --workers 0
--expect-workers 2`) in one, two `kneeswarm worker`s in two others, the demo target in a fourth,
joined by a bridge in the root namespace.  Skipped where namespaces cannot be created."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from kneeswarm.contracts.rundir import RunDir

from conftest import REPO, ip, skip_without_netns, wait_for
from test_distributed import REPORT_INTERVAL, check_worker_table

pytestmark = pytest.mark.slow

ROLES = ("master", "worker1", "worker2", "target")
MASTER_PORT, TARGET_PORT = 5557, 8000


def _stop_all(procs: list[subprocess.Popen]) -> None:
    """SIGTERM (a worker's last report goes out), then SIGKILL after 20 s."""
    for p in procs:
        p.terminate()
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.fixture
def hosts():
    """{role: (namespace, address)} on one bridge; always removed."""
    skip_without_netns()
    tag = os.getpid() % 10000
    net = f"10.215.{100 + os.getpid() % 100}"
    bridge = f"kswb{tag}"
    made: list[str] = []
    out: dict = {}
    links: dict[str, str] = {}
    try:
        if ip("link", "add", bridge, "type", "bridge", check=False).returncode != 0:
            pytest.skip("cannot create a bridge")
        ip("link", "set", bridge, "up")
        for i, role in enumerate(ROLES):
            ns, here, there, addr = f"ksw{tag}{role[0]}{i}", f"kswv{tag}{i}", f"kswp{tag}{i}", f"{net}.{i + 2}"
            if ip("netns", "add", ns, check=False).returncode != 0:
                pytest.skip("cannot create a network namespace")
            made.append(ns)
            ip("link", "add", here, "type", "veth", "peer", "name", there)
            ip("link", "set", there, "netns", ns)
            ip("link", "set", here, "master", bridge)
            ip("link", "set", here, "up")
            ip("netns", "exec", ns, "ip", "addr", "add", f"{addr}/24", "dev", there)
            ip("netns", "exec", ns, "ip", "link", "set", there, "up")
            ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
            out[role] = (ns, addr)
            links[role] = here
        out["links"] = links  # {role: its veth end on the bridge}: down = that host's network gone
        yield out
    finally:
        for ns in made:
            ip("netns", "del", ns, check=False)
        ip("link", "del", bridge, check=False)


def _in(ns: str, *argv: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, *argv], env=env, text=True, **kw)


def test_master_two_workers_and_target_on_four_hosts(hosts, tmp_path):
    (mns, maddr), (tns, taddr) = hosts["master"], hosts["target"]
    target = _in(tns, "-m", "kneeswarm.target", "--host", taddr, "--port", str(TARGET_PORT), "--mode", "knee",
                 "--slots", "4", "--service-ms", "20", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers = [_in(hosts[w][0], "-m", "kneeswarm.launch.cli", "worker", "--master", f"{maddr}:{MASTER_PORT}",
                   stdout=(tmp_path / f"{w}.log").open("w"), stderr=subprocess.STDOUT) for w in ("worker1", "worker2")]
    out = tmp_path / "runs"
    try:
        run = _in(mns, "-m", "kneeswarm.launch.cli", "run", "--target", f"http://{taddr}:{TARGET_PORT}", "--steps", "2,4",
                  "--hold", "4", "--ramp", "0.5", "--settle", "0.5", "--workers", "0", "--expect-workers", "2",
                  "--master-bind-host", maddr, "--master-port", str(MASTER_PORT), "--out", str(out), "-q",
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _, err = run.communicate(timeout=240)
    finally:
        _stop_all([*workers, target])
    assert run.returncode == 0, err[-2000:]
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    rows = RunDir(run_dir).read_requests()
    by_worker = rows["worker"].value_counts()
    assert set(by_worker.index) == {"worker-0", "worker-1"}  # both workers, each on its own host, sent load
    assert int(by_worker.sum()) == len(rows)
    s = check_worker_table(run_dir)  # per worker and step: rows, req/s, CPU, RSS, users against numpy
    assert sorted(s["workers"]) == ["worker-0", "worker-1"]  # the report lists both
    assert all(s["workers"][w]["lost"] is None for w in s["workers"])
    assert all(c["requests"] > 0 for st in s["steps"] for c in st["workers"].values())
    assert sum(st["requests"] for st in s["steps"]) <= len(rows)
    gen = sorted(p.name for p in (run_dir / "generator").glob("worker-*.csv"))
    assert gen == ["worker-0.csv", "worker-1.csv"]  # their CPU/RSS/users samples came home too


@pytest.mark.long
def test_a_worker_whose_network_goes_mid_step_is_flagged(hosts, tmp_path):
    """worker2's link goes down during step 1: the run completes on worker1, step 1 (only) is
    flagged with the worker and the time, and the rows worker2 reported before are kept."""
    (mns, maddr), (tns, taddr) = hosts["master"], hosts["target"]
    target = _in(tns, "-m", "kneeswarm.target", "--host", taddr, "--port", str(TARGET_PORT), "--mode", "knee",
                 "--slots", "4", "--service-ms", "20", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = tmp_path / "runs"
    run = _in(mns, "-m", "kneeswarm.launch.cli", "run", "--target", f"http://{taddr}:{TARGET_PORT}", "--steps", "2,4,6",
              "--hold", "8", "--ramp", "0.5", "--settle", "0.5", "--workers", "0", "--expect-workers", "2",
              "--master-bind-host", maddr, "--master-port", str(MASTER_PORT), "--out", str(out), "-q",
              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    workers = {}
    try:
        for w in ("worker1", "worker2"):
            workers[w] = _in(hosts[w][0], "-m", "kneeswarm.launch.cli", "worker", "--master", f"{maddr}:{MASTER_PORT}",
                             stdout=(tmp_path / f"{w}.log").open("w"), stderr=subprocess.STDOUT)

        def step_1_running() -> bool:
            steps = list(out.glob("*/steps.csv"))
            return bool(steps) and len(RunDir(steps[0].parent).read_steps()) >= 2

        wait_for(lambda: step_1_running() or run.poll() is not None, 120, "step 1")
        assert run.poll() is None, run.communicate()[1][-2000:]
        time.sleep(3)
        t_cut = time.time()
        ip("link", "set", hosts["links"]["worker2"], "down")
        _, err = run.communicate(timeout=240)
    finally:
        _stop_all([*workers.values(), target])
        if run.poll() is None:
            run.kill()
            run.wait()
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    meta = RunDir(run_dir).read_meta()
    assert meta["ended"] == "completed", err[-2000:]
    (lost,) = meta["workers_lost"]
    assert lost["step"] == 1 and t_cut <= lost["t"] <= t_cut + 30
    assert t_cut - REPORT_INTERVAL <= lost["t_last_heard"] <= t_cut + 1.5
    rows = RunDir(run_dir).read_requests()
    last = rows.groupby("worker")["t_start"].max()
    assert set(last.index) == {"worker-0", "worker-1"}
    # the worker named lost is the one whose rows stop at the cut (its network, not the other's, went);
    # what it reported before the cut is kept; the other carried step 2
    assert t_cut - REPORT_INTERVAL - 1.5 <= last[lost["worker"]] <= t_cut + 1.0
    assert last.drop(lost["worker"]).iloc[0] > t_cut + 8
    s = check_worker_table(run_dir)
    flag = [r for r in s["steps"][1]["reasons"] if f"worker {lost['worker']} lost at" in r]
    assert len(flag) == 1 and "1 of 2 workers" in flag[0] and s["steps"][1]["valid"] is False
    assert not any("lost at" in r for i in (0, 2) for r in s["steps"][i]["reasons"])

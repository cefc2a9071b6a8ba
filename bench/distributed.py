"""Distributed load: requests/s per worker process for 1 and 2 workers against the same fast target,
and the master's CPU-seconds per 100,000 request rows received.

    .venv/bin/python bench/distributed.py [--seconds 10] [--users-per-worker 8]

The target is bench/generator.py's minimal keep-alive responder in its own process.  For N = 1 and
2 a real Locust master (kneeswarm's locustfile, recording every row to parquet, as under
`kneeswarm run`) and N worker processes run one step of users-per-worker x N users.  Requests/s
per worker comes from the rows the master wrote (their t_start span); the ratio of the 2-worker
figure to the 1-worker one says how close to linear the scaling is (target >= 0.9).  The master's
CPU time during the load (psutil, from the first step to its exit; start-up left out, and its
whole rusage from wait4 printed beside it) per 100,000 rows received, and the rows per master
CPU-second at which one master core would saturate (target >= 200,000 rows/s), are printed.
On a machine with fewer cores than target + master + workers, the ratio measures the machine.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

from generator import free_port  # noqa: E402  (bench/ is not a package)

SWARM = REPO / "locustfiles" / "swarm.py"


def run_once(url: str, workers: int, users: int, seconds: float, tmp: Path) -> dict[str, float]:
    """One master + N workers, one step; rows, span and the master's CPU seconds."""
    run_dir = tmp / f"run-{workers}"
    plan = tmp / f"plan-{workers}.toml"
    plan.write_text(f'name = "bench"\ntarget = "{url}"\n[load]\nsteps = [{users}]\nramp = 0.0\n'
                    f"hold = {seconds}\nsettle = 0.0\n")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    log = (tmp / f"master-{workers}.log").open("w")
    master = subprocess.Popen(
        [sys.executable, "-m", "locust", "-f", str(SWARM), "--master", "--headless", "--master-bind-host", "127.0.0.1",
         "--master-bind-port", str(port), "--expect-workers", str(workers), "--kneeswarm-plan", str(plan),
         "--kneeswarm-run-dir", str(run_dir), "--loglevel", "WARNING", "--only-summary"],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    procs = [subprocess.Popen([sys.executable, "-m", "locust", "-f", str(SWARM), "--worker", "--master-host",
                               "127.0.0.1", "--master-port", str(port), "--loglevel", "WARNING"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(workers)]
    deadline = time.monotonic() + seconds + 120
    proc, at_start, last = psutil.Process(master.pid), None, None
    while time.monotonic() < deadline:
        pid, status, usage = os.wait4(master.pid, os.WNOHANG)
        if pid:
            break
        try:
            cpu = proc.cpu_times()
            last = cpu.user + cpu.system
        except psutil.Error:
            pass
        if at_start is None and (run_dir / "steps.csv").exists():
            at_start = last  # the load begins: start-up (imports, workers connecting) is left out
        time.sleep(0.2)
    else:
        master.kill()
        _, status, usage = os.wait4(master.pid, 0)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
    t = pq.read_table(run_dir / "requests", columns=["t_start", "worker"]).to_pandas()
    span = float(t["t_start"].max() - t["t_start"].min())
    return {"rows": len(t), "span": span, "master_cpu": usage.ru_utime + usage.ru_stime,
            "master_cpu_load": (last or 0.0) - (at_start or 0.0),
            "per_worker": {w: int(n) for w, n in t["worker"].value_counts().items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--users-per-worker", type=int, default=8)
    a = ap.parse_args()
    port = free_port()
    target = subprocess.Popen([sys.executable, str(REPO / "bench" / "generator.py"), "--serve", str(port)])
    tmp = Path(tempfile.mkdtemp(prefix="kneeswarm-bench-dist-"))
    try:
        time.sleep(1.0)
        url = f"http://127.0.0.1:{port}"
        results = {n: run_once(url, n, a.users_per_worker * n, a.seconds, tmp) for n in (1, 2)}
    finally:
        target.terminate()
        target.wait()
    print(f"cores: {os.cpu_count()}, {a.users_per_worker} users per worker, {a.seconds:.0f}s step")
    per = {}
    for n, r in results.items():
        per[n] = r["rows"] / r["span"] / n
        print(f"{n} worker(s): {r['rows']} rows in {r['span']:.1f}s = {per[n]:.0f} req/s per worker; "
              f"rows by worker {r['per_worker']}")
    print(f"per-worker ratio 2 vs 1: {per[2] / per[1]:.2f} (target >= 0.9)")
    for n, r in results.items():
        per_100k = r["master_cpu_load"] / r["rows"] * 1e5
        print(f"master with {n} worker(s): {r['master_cpu_load']:.2f} CPU-s during the load "
              f"({r['master_cpu']:.2f} with start-up) for {r['rows']} rows = {per_100k:.2f} CPU-s per 100,000 rows; "
              f"one master core saturates at ~{1e5 / per_100k:,.0f} rows/s (target >= 200,000)")


if __name__ == "__main__":
    main()

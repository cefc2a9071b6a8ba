"""Distributed load: requests/s per worker process for 1 and 2 workers against the same fast target,
and the master's CPU-seconds per 100,000 request rows received.

    .venv/bin/python bench/distributed.py [--seconds 8] [--users-per-worker 8] [--repeats 3]

The target is bench/generator.py's minimal keep-alive responder in its own process.  For N = 1 and
2 a real Locust master (kneeswarm's locustfile, recording every row to parquet, as under
`kneeswarm run`) and N worker processes run one step of users-per-worker x N users.  Requests/s
per worker comes from the rows the master wrote (their t_start span); the ratio of the 2-worker
figure to the 1-worker one says how close to linear the scaling is (target >= 0.9).  Each
figure is measured --repeats times, N = 1 and N = 2 one after the other in each round so that
both see the same machine, and the median is printed beside every run's value.

The master's CPU time during the load (psutil, from the first step to its exit; start-up left
out) has two parts: Locust's own cost per second (heartbeats, stats, the gevent loop: there with
no rows at all) and the cost per row.  An idle round (the same master and workers, each user
waiting 1 s between requests) measures the first; the second is what is left, per row.  One
master core saturates where fixed + rows/s x per-row cost reaches one CPU-second per second
(target >= 200,000 rows/s); the gross figure (all the master's CPU divided by the rows, which on
a small machine mostly measures the fixed part) is printed too.  bench/master_path.py measures
the per-row path alone, in one process.

On a machine with fewer cores than target + master + workers, the ratio measures the machine: the
workers then share cores, and two of them cannot each send what one sends alone.  A paced round
(each user waiting PACED_WAIT_MS between requests, so that a worker uses a fraction of a core)
measures what the distribution itself costs on such a machine: does a second worker add its full
rate, or do the master and the report path take some of it?
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

from generator import free_port  # noqa: E402  (bench/ is not a package)

SWARM = REPO / "locustfiles" / "swarm.py"
PACED_WAIT_MS = 20.0  # paced rounds: ~8 users x 1000/20 = ~400 req/s per worker, a fraction of a core


def run_once(url: str, workers: int, users: int, seconds: float, tmp: Path, wait_ms: float = 0.0) -> dict[str, Any]:
    """One master + N workers, one step; rows, span and the master's CPU seconds (and wall seconds)
    during the load."""
    tag = f"{workers}-{'idle' if wait_ms else 'load'}-{time.monotonic_ns()}"
    run_dir = tmp / f"run-{tag}"
    plan = tmp / f"plan-{tag}.toml"
    plan.write_text(f'name = "bench"\ntarget = "{url}"\n[load]\nsteps = [{users}]\nramp = 0.0\n'
                    f"hold = {seconds}\nsettle = 0.0\nwait_ms = {wait_ms}\n")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    log = (tmp / f"master-{tag}.log").open("w")
    master = subprocess.Popen(
        [sys.executable, "-m", "locust", "-f", str(SWARM), "--master", "--headless", "--master-bind-host", "127.0.0.1",
         "--master-bind-port", str(port), "--expect-workers", str(workers), "--kneeswarm-plan", str(plan),
         "--kneeswarm-run-dir", str(run_dir), "--loglevel", "WARNING", "--only-summary"],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    procs = [subprocess.Popen([sys.executable, "-m", "locust", "-f", str(SWARM), "--worker", "--master-host",
                               "127.0.0.1", "--master-port", str(port), "--loglevel", "WARNING"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(workers)]
    deadline = time.monotonic() + seconds + 120
    proc, at_start, last, t_start, t_last = psutil.Process(master.pid), None, None, None, None
    while time.monotonic() < deadline:
        pid, status, usage = os.wait4(master.pid, os.WNOHANG)
        if pid:
            break
        try:
            cpu = proc.cpu_times()
            last, t_last = cpu.user + cpu.system, time.monotonic()
        except psutil.Error:
            pass
        if at_start is None and (run_dir / "steps.csv").exists():
            at_start, t_start = last, t_last  # the load begins: start-up (imports, workers connecting) is left out
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
            "master_cpu_load": (last or 0.0) - (at_start or 0.0), "wall_load": (t_last or 0.0) - (t_start or 0.0),
            "per_worker": {w: int(n) for w, n in t["worker"].value_counts().items()}}


def master_path_rates(repeats: int) -> list[float]:
    """Rows per CPU-second of the master's row path, one per repeat (bench/master_path.py, in its
    own process: importing Locust here would monkey-patch this driver)."""
    out = subprocess.run([sys.executable, str(REPO / "bench" / "master_path.py"), "--repeats", str(repeats)],
                         capture_output=True, text=True, check=True, timeout=600).stdout
    runs = re.search(r"\(runs: ([\d, ]+);", out.splitlines()[-1])
    return [float(x.replace(",", "")) for x in runs.group(1).split(", ")] if runs else []


def _runs(values: list[float], fmt: str = "{:,.0f}") -> str:
    """"median (runs: a, b, c)"."""
    return f"{fmt.format(statistics.median(values))} (runs: {', '.join(fmt.format(v) for v in values)})"


def master_figures(load: list[dict[str, Any]], idle: list[dict[str, Any]]) -> dict[str, Any]:
    """Per round: the master's fixed CPU per second (idle round), its CPU-s per 100,000 rows gross
    and beyond the fixed part; and how much of that difference the idle rounds' spread can hide."""
    fixed = [i["master_cpu_load"] / i["wall_load"] if i["wall_load"] > 0 else 0.0 for i in idle]
    out: dict[str, Any] = {"fixed": fixed, "gross_100k": [], "marginal_100k": [], "gross_saturate": []}
    for r, f in zip(load, fixed):
        out["gross_100k"].append(r["master_cpu_load"] / r["rows"] * 1e5)
        out["marginal_100k"].append((r["master_cpu_load"] - f * r["wall_load"]) / r["rows"] * 1e5)
        out["gross_saturate"].append(r["rows"] / r["master_cpu_load"])
    # the per-row figure is resolved only when the rows' CPU exceeds what the fixed part varies by
    spread = (max(fixed) - min(fixed)) * statistics.median(r["wall_load"] for r in load) + 0.02  # + CPU-time ticks
    out["resolved"] = statistics.median(m * r["rows"] / 1e5 for m, r in zip(out["marginal_100k"], load)) > 2 * spread
    return out


def print_master(n: int, m: dict[str, Any], path_rate: float) -> None:
    """The master's figures with n workers; its saturation from the fixed part and the per-row cost
    (measured here when resolved, else bench/master_path.py's in-process figure)."""
    fixed = statistics.median(m["fixed"])
    print(f"master with {n} worker(s): Locust's fixed cost {_runs([100 * f for f in m['fixed']], '{:.1f}')} % of a "
          f"core; CPU-s per 100,000 rows beyond it {_runs(m['marginal_100k'], '{:.3f}')}, gross "
          f"{_runs(m['gross_100k'], '{:.2f}')}")
    per_row = statistics.median(m["marginal_100k"]) / 1e5
    if m["resolved"] and per_row > 0:
        source = "the per-row cost measured here"
    else:
        per_row, source = 1.0 / path_rate, ("the per-row cost of bench/master_path.py (the rows' CPU here is within "
                                             "what the fixed part varies by: this machine cannot resolve it)")
    print(f"  one master core saturates at ~{(1.0 - fixed) / per_row:,.0f} rows/s (target >= 200,000), from the fixed "
          f"cost and {source}; gross (all CPU counted per row, at this machine's row rate): "
          f"~{_runs(m['gross_saturate'])}")


def print_paced(paced: dict[int, list[dict[str, Any]]]) -> None:
    """The paced rounds: req/s per worker at 1 and 2 workers, each worker below a core."""
    per = {n: [r["rows"] / r["span"] / n for r in rs] for n, rs in paced.items()}
    ratios = [two / one for one, two in zip(per[1], per[2])]
    print(f"paced ({PACED_WAIT_MS:.0f} ms between a user's requests): {_runs(per[1])} req/s per worker alone, "
          f"{_runs(per[2])} with 2; ratio {_runs(ratios, '{:.2f}')} (target >= 0.9: the distribution's own cost)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--users-per-worker", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    port = free_port()
    target = subprocess.Popen([sys.executable, str(REPO / "bench" / "generator.py"), "--serve", str(port)])
    tmp = Path(tempfile.mkdtemp(prefix="kneeswarm-bench-dist-"))
    load: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    idle: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    paced: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    try:
        time.sleep(1.0)
        url = f"http://127.0.0.1:{port}"
        for _ in range(a.repeats):  # N = 1 and 2 side by side in each round: they see the same machine
            for n in (1, 2):
                load[n].append(run_once(url, n, a.users_per_worker * n, a.seconds, tmp))
                idle[n].append(run_once(url, n, a.users_per_worker * n, a.seconds, tmp, wait_ms=1000.0))
                paced[n].append(run_once(url, n, a.users_per_worker * n, a.seconds, tmp, wait_ms=PACED_WAIT_MS))
    finally:
        target.terminate()
        target.wait()
    print(f"cores: {os.cpu_count()}, {a.users_per_worker} users per worker, {a.seconds:.0f}s step, "
          f"{a.repeats} rounds; medians, with each round's value")
    per = {n: [r["rows"] / r["span"] / n for r in rs] for n, rs in load.items()}
    for n in (1, 2):
        print(f"{n} worker(s): {_runs(per[n])} req/s per worker; rows by worker in the last round "
              f"{load[n][-1]['per_worker']}")
    ratios = [two / one for one, two in zip(per[1], per[2])]
    print(f"per-worker ratio 2 vs 1: {_runs(ratios, '{:.2f}')} (target >= 0.9; {os.cpu_count()} cores for "
          f"target + master + workers: below 5 cores this measures the machine)")
    print_paced(paced)
    path = master_path_rates(a.repeats)
    print(f"master row path in one process (bench/master_path.py): {_runs(path)} rows per CPU-second")
    for n in (1, 2):
        print_master(n, master_figures(load[n], idle[n]), statistics.median(path))


if __name__ == "__main__":
    main()

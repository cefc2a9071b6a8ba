"""A synthetic run directory from a ground-truth model, shared by the analysis tests.

The model is a closed-loop server with K slots and service time S: with N users,
qps = min(N, K) * 1000 / S and, by Little's law, latency = S * max(1, N / K) (times a
lognormal jitter).  A retrograde variant loses 23 % of its QPS at 32 users after 16, as in
the source article.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from kneeswarm.contracts.plan import AnalysisPlan, LoadPlan, Plan
from kneeswarm.contracts.rundir import RunDir, write_csv

T0 = 1_700_000_000.0
RAMP, HOLD, SETTLE = 2.0, 12.0, 2.0
S_MS = 10.0


def closed_loop(k: int, s_ms: float = S_MS) -> Callable[[int], tuple[float, float]]:
    """users -> (qps, mean latency ms) of a server with k slots."""
    return lambda n: (min(n, k) * 1000.0 / s_ms, s_ms * max(1.0, n / k))


def retrograde(k: int = 16, drop: float = 0.23, s_ms: float = S_MS) -> Callable[[int], tuple[float, float]]:
    """Linear up to k users, then QPS falls by ``drop`` at 2k (latency from Little's law)."""
    def model(n: int) -> tuple[float, float]:
        q = min(n, k) * 1000.0 / s_ms * ((1 - drop) if n > k else 1.0)
        return q, n / q * 1000.0
    return model


def make_run(tmp_path: Path, model: Callable[[int], tuple[float, float]], users=(1, 2, 4, 8, 16), *,
             seed: int = 0, noise: float = 0.03, min_requests: int = 100, complete: bool = True,
             last_t_end: bool = True, meta: bool = True, error_plan: dict | None = None,
             generator_cpu: dict[int, float] | None = None, hosts: bool = True, t0: float = T0,
             migrations_per_user: float = 5.0) -> RunDir:
    """A synthetic run directory: steps, request parts (one per step), generator and host CSVs
    (the process's migrations/s: ``migrations_per_user`` x users, at 300 % CPU from 4 users)."""
    rng = np.random.default_rng(seed)
    rd = RunDir.create(tmp_path, "synthetic")
    plan = Plan(load=LoadPlan(steps=list(users), ramp=RAMP, hold=HOLD, settle=SETTLE),
                analysis=AnalysisPlan(min_requests=min_requests))
    rd.plan_path.write_text(plan.to_toml())
    steps, t = [], t0
    for i, n in enumerate(users):
        t_ramp, t_steady, t_end = t, t + RAMP, t + RAMP + HOLD
        steps.append([i, n, t_ramp, t_steady, t_end if (last_t_end or i < len(users) - 1) else ""])
        qps, lat = model(n)
        qps *= 1 + rng.uniform(-noise, noise)
        count = int(qps * (t_end - t_ramp))
        ts = np.sort(rng.uniform(t_ramp, t_end, count))
        latency = lat * rng.lognormal(0.0, 0.1, count)
        latency[ts < t_steady + SETTLE] *= 3.0  # ramp/settle rows look different: wrong windows show
        ok = np.ones(count, dtype=bool)
        error: list[str | None] = [None] * count
        for category, n_err in (error_plan or {}).get(i, {}).items():
            free = np.flatnonzero(ok & (ts >= t_steady + SETTLE))
            pick = rng.choice(free, n_err, replace=False)
            ok[pick] = False
            for j in pick:
                error[j] = None if category == "null" else category
        rd.write_request_part({
            "t_start": ts.tolist(), "latency_ms": latency.tolist(), "ok": ok.tolist(),
            "status": np.where(ok, 200, 503).tolist(), "error": error, "step": [i] * count,
            "users": [n] * count, "worker": ["w1"] * count, "name": ["infer"] * count,
        }, seq=i)
        t = t_end
    rd.write_steps(steps)
    secs = np.arange(t0, t, 1.0)
    step_of = np.searchsorted([s[2] for s in steps], secs, side="right") - 1
    users_at = np.asarray(users)[step_of]
    gcpu = np.array([(generator_cpu or {}).get(int(i), 30.0) for i in step_of])
    write_csv(rd.generator_dir / "w1.csv", ("t", "cpu_pct", "rss_mb", "users", "lag_ms"),
              zip(secs, gcpu, [80.0] * len(secs), users_at, [1.0] * len(secs)))
    if hosts:
        busy = np.minimum(users_at, 4) / 4
        hd = rd.host_dir("server-1")
        write_csv(hd / "vmstat.csv", ("t", "r", "b", "us", "sy", "id", "wa", "cs"),
                  zip(secs, users_at * 1.0, [0] * len(secs), 70 * busy, 10 * busy, 100 - 80 * busy,
                      [0] * len(secs), 1000 * users_at))
        write_csv(hd / "process.csv", ("t", "pid", "cpu_pct", "rss_mb", "threads", "cswch_s", "migrations_s"),
                  zip(secs, [4242] * len(secs), 300 * busy, [500.0] * len(secs), users_at + 2,
                      50 * users_at, migrations_per_user * users_at))
    if meta:
        rd.update_meta(run_id=rd.path.name, complete=complete, ended="finished" if complete else "crashed")
    return rd


def steady_rows(rd: RunDir, step: int, whole: bool = False) -> pd.DataFrame:
    """The steady rows of one step, selected here independently of kneeswarm.analysis.measure.loadstats
    (``whole``: every row of the run instead, for figures that count rows across windows)."""
    df = pd.concat([pq.read_table(p).to_pandas() for p in rd.request_parts()], ignore_index=True)
    if whole:
        return df
    st = pd.read_csv(rd.steps_path)
    row = st[st["index"] == step].iloc[0]
    lo = row["t_steady"] + SETTLE
    hi = row["t_end"] if not math.isnan(row["t_end"]) else (df["t_start"] + df["latency_ms"] / 1000).max()
    return df[(df["t_start"] >= lo) & (df["t_start"] < hi)]


def strict_json(path: Path) -> dict:
    def no_constant(name: str):
        raise AssertionError(f"{path} contains {name}")
    return json.loads(path.read_text(), parse_constant=no_constant)

"""The row watermark in real processes (locustfiles/watermark.py): a search probe is judged only on
rows that were all in when it was judged, with a real worker (`kneeswarm run`, one worker process)
and with a local runner (plain `locust -f locustfiles/swarm.py --headless`), side by side.

The target holds every request SERVICE_S: longer than the worker's report interval (3 s) and than
the old fixed guess of how late rows arrive (6 s).  Open loop with constant arrivals keeps requests
in flight whose starts cover the last SERVICE_S seconds at every instant, so whenever a probe is
judged some of them started more than 6 s earlier and were not done: a horizon of now − 6 s would
count their window short.  What was in at the judgment is read off the rows themselves (a row done
after the judgment was not in it), against the window and the time the master recorded
(generator/search.json)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from kneeswarm.launch.cli import start_target, stop_target
from kneeswarm.launch.search import MIN_PROBE_REQUESTS
from tests.conftest import REPO, side_by_side, start_cli

SERVICE_S = 7.0  # > WORKER_REPORT_INTERVAL (3 s) and > the old fixed lag (recording.ROW_LAG_S, 6 s)
RATE, SOURCE_RATE = 8.0, 2.0  # 8 req/s: ~56 requests in flight, ~8 of them started 6-7 s before any instant
PLAN = (f'[load]\nmode = "search"\narrivals = "open"\narrival = "constant"\nsource_rate = {SOURCE_RATE}\n'
        f'start = {RATE}\nmax = {2 * RATE}\nmax_duration = 20\nhold = 4\nsettle = 1\nramp = 0.5\nworkers = 1\n'
        '[request]\ntimeout = 15\n')


def _rows(run: Path) -> pd.DataFrame:
    parts = sorted((run / "requests").glob("part-*.parquet"))
    return pd.concat([pd.read_parquet(p, columns=["t_start", "latency_ms"]) for p in parts], ignore_index=True)


def _check_windows(run: Path) -> int:
    """Every judged probe's window held all its rows when it was judged; returns the probes checked."""
    doc = json.loads((run / "generator" / "search.json").read_text())
    rows = _rows(run)
    done = rows["t_start"] + rows["latency_ms"] / 1000.0
    judged = [p for p in doc["probes"] if "window" in p]
    assert judged, doc
    for p in judged:
        (t_lo, horizon), t_judged = p["window"], p["t_judged"]
        out = rows["t_start"][done > t_judged]  # not done when the probe was judged: not in yet
        assert len(out) > 0, p  # the setup's slow requests were in flight
        assert (out >= horizon).all(), (p, out[out < horizon].min(), horizon)  # the horizon never passed one
        in_window = int(((rows["t_start"] >= t_lo) & (rows["t_start"] < horizon)).sum())
        assert p["measured"]["requests"] == in_window, (p, in_window)  # all of them were counted
    assert judged[0]["measured"]["requests"] >= MIN_PROBE_REQUESTS  # judged on its rows, not on a timeout
    return len(judged)


@pytest.mark.long
@pytest.mark.slow
def test_a_probe_is_judged_only_on_rows_all_in_with_a_worker_and_with_a_local_runner(tmp_path):
    proc, url = start_target(["--mode", "knee", "--slots", "128", "--service-ms", str(SERVICE_S * 1000)])
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    try:
        with side_by_side() as started:
            started["worker"] = start_cli("run", str(plan), "--target", url, "--out", str(tmp_path / "worker"), "-q")
            started["local"] = subprocess.Popen(
                [sys.executable, "-m", "locust", "-f", str(REPO / "locustfiles" / "swarm.py"), "--headless",
                 "--host", url, "--kneeswarm-plan", str(plan), "--kneeswarm-out", str(tmp_path / "local")],
                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env={**os.environ, "PYTHONPATH": str(REPO)})
            outs = {name: p.communicate(timeout=300) for name, p in started.items()}
            codes = {name: p.returncode for name, p in started.items()}
    finally:
        stop_target(proc)
    assert set(codes.values()) == {0}, (codes, {n: o[1][-3000:] for n, o in outs.items()})
    for name in ("worker", "local"):
        (run,) = [d for d in (tmp_path / name).iterdir() if d.is_dir()]
        assert _check_windows(run) >= 1, name

"""TorchServe (Java frontend, Python workers, CPU torch), driven by a real `kneeswarm run` and
checked against the server's own numbers.

The model: a custom handler (torchserve_handler.py) taking SERVICE_MS per request, WORKERS
worker processes, batch size 1: a closed loop saturates at WORKERS users (the KNEE).  The truths
are the server's: its access log (one line per request with its own time in ms, written by the
frontend with a timestamp) and its Prometheus metrics (ts_inference_requests_total).
"""

from __future__ import annotations

import datetime as dt
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import requests

from conftest import (
    FIGURES, assert_every_step_valid, kneeswarm_run, per_step_counts, plan_text, read_summary, record_counts, scrape,
    rows_and_steps, Run, target_of)
from servers import Installed, torchserve, torchserve_server

SERVER_INSTALL = torchserve  # installed with the others before the first test (conftest.py)

pytestmark = pytest.mark.slow

WORKERS, SERVICE_MS = 4, 50.0
KNEE = WORKERS
STEPS = (1, 2, 4, 8, 16)
HOLD_S = 8.0
# log4j2's access log: "2026-12-01T11:24:00,123 - /127.0.0.1:51234 "POST /predictions/echo HTTP/1.1" 200 52"
ACCESS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d,\d{3}) - \S+ \"POST /predictions/echo HTTP/1.1\" 200 (\d+)")


@dataclass
class TSRun:
    installed: Installed
    run: Run
    access: list[tuple[float, float]]  # (when the frontend wrote its line, its time in ms) per request
    before: dict[str, float]
    after: dict[str, float]
    t_before: float  # when `before` was scraped


def served(m: dict[str, float]) -> float:
    return sum(v for k, v in m.items() if k.split("{")[0] == "ts_inference_requests_total")


@pytest.fixture(scope="module")
def ts() -> Installed:
    return torchserve()


def read_access(path: Path) -> list[tuple[float, float]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        m = ACCESS.match(line)
        if m:  # the machine's local time, as log4j writes it
            t = dt.datetime.strptime(m[1], "%Y-%m-%dT%H:%M:%S,%f").timestamp()
            out.append((t, float(m[2])))
    return out


@pytest.fixture(scope="module")
def ts_run(ts, tmp_path_factory) -> TSRun:
    home = tmp_path_factory.mktemp("torchserve")
    server, mport = torchserve_server(ts, home, {"echo": Path(__file__).with_name("torchserve_handler.py")}, WORKERS)
    metrics = f"http://127.0.0.1:{mport}/metrics"
    try:
        deadline = time.monotonic() + 120  # /ping is healthy before the workers are up
        while time.monotonic() < deadline and requests.post(server.url + "/predictions/echo", json={"data": [1]},
                                                            timeout=30).status_code != 200:
            time.sleep(0.5)
        t_before, before = time.time(), scrape(metrics)
        plan = plan_text("torchserve", server.url, "torchserve", metrics, STEPS, HOLD_S,
                         'model = "echo"\nshape = [1, 8]\n')
        # the monitored process: the Java frontend (the `torchserve` launcher only waits for it)
        run = kneeswarm_run(plan, home / "out", "--pid", str(server.serving_pid("java")))
        time.sleep(1.0)
        after = scrape(metrics)
    finally:
        server.stop()
    return TSRun(ts, run, read_access(home / "logs" / "access_log.log"), before, after, t_before)


def test_every_step_valid_and_no_errors(ts_run):
    assert_every_step_valid(ts_run.run.run_dir)


def test_requests_equal_the_server_counter_and_access_log(ts_run):
    rows, steps = rows_and_steps(ts_run.run.run_dir)
    n = served(ts_run.after) - served(ts_run.before)
    # the access log also holds the warm-up predictions before the `before` scrape
    during = [t for t, _ in ts_run.access if t >= ts_run.t_before]
    assert len(during) == n, (len(during), n)
    # kneeswarm's preflight sends one real prediction before the load; those in flight when the
    # load stopped were served but never recorded
    assert 0 <= n - 1 - len(rows) <= max(STEPS), (n, len(rows))
    figs = per_step_counts(rows, steps, during)
    record_counts("torchserve", figs)


def test_client_p50_at_least_the_server_p50_and_the_knee(ts_run):
    s = read_summary(ts_run.run.run_dir)
    figs = []
    for st in s["steps"]:
        own = [ms for t, ms in ts_run.access if st["t_lo"] <= t < st["t_hi"]]
        server_p50 = float(np.percentile(own, 50))
        figs.append((st["users"], st["p50_ms"], server_p50))
        # the access log's time is in whole ms: the client's P50 is at least its floor
        assert st["p50_ms"] >= server_p50 - 1.0, (st["users"], st["p50_ms"], server_p50)
    knee = s["knee"]["users"] if s.get("knee") else None
    ids = sorted(f["id"] for f in s["findings"])
    FIGURES.setdefault("torchserve", {}).update({
        "server": f"TorchServe ({WORKERS} workers, {SERVICE_MS:.0f} ms handler)", "version": ts_run.installed.version,
        "protocol": "torchserve", "P50 ms client/server": " ".join(f"{u}u {c:.0f}/{v:.0f}" for u, c, v in figs),
        "knee (users)": str(knee), "expected knee": str(KNEE), "findings": ", ".join(ids) or "none",
        "cold install s": str(ts_run.installed.cold_s), "run s": f"{ts_run.run.seconds:.0f}"})
    assert knee == KNEE, [(st["users"], st["qps"]) for st in s["steps"]]


def test_target_metrics_matched_on_the_live_scrape(ts_run):
    s = read_summary(ts_run.run.run_dir)
    used = {k: v for host in s["target_series"].values() for k, v in host.items()}
    assert {k for k, v in used.items() if v["server"] == "torchserve"} >= {"requests_s", "server_latency_ms"}, used
    for st in s["steps"]:
        t = target_of(st)
        rel = 0.05 + st["p50_ms"] / 1000.0 / st["window_s"]  # ends vs starts at the window's edges
        assert t["requests_s"] == pytest.approx(st["qps"], rel=rel), (st["users"], t, st["qps"])
        assert t["server_latency_ms"] >= SERVICE_MS, (st["users"], t)

"""KServe's Python model server (v2 protocol, and v1 through the `tfserving` protocol's path),
driven by a real `kneeswarm run` and checked against the server's own numbers.

The model (kserve_model.py) serves at most SLOTS requests at once, each BUSY_MS of the event
loop's CPU and WAIT_MS without it: a closed loop saturates at SLOTS users (the KNEE), and above it
QPS holds while latency grows.  The truths are the server's: its /metrics
(request_predict_seconds: a count and a latency histogram per request) and its log (one latency
line per request, stamped by this test as it arrives).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from conftest import (
    FIGURES, assert_every_step_valid, kneeswarm_run, per_step_counts, plan_text, read_summary, record_counts, scrape,
    rows_and_steps, Run, target_of)
from servers import Installed, Server, free_port, kserve

SERVER_INSTALL = kserve  # installed with the others before the first test (conftest.py)

pytestmark = pytest.mark.slow

SLOTS, BUSY_MS, WAIT_MS = 4, 2.0, 48.0
KNEE = SLOTS  # QPS rises to SLOTS users (<= SLOTS * 1000 / 50 ms = 80/s) and holds after
STEPS = (1, 2, 4, 8, 16)
HOLD_S = 8.0
PREDICT = "request_predict_seconds"


@dataclass
class KServeRun:
    installed: Installed
    run: Run
    log: list[tuple[float, str]]
    before: dict[str, float]
    after: dict[str, float]


@pytest.fixture(scope="module")
def ks() -> Installed:
    return kserve()


def start(ks: Installed) -> Server:
    port = free_port()
    return Server([str(ks.paths["python"]), str(Path(__file__).with_name("kserve_model.py")), "--http_port", str(port),
                   "--grpc_port", str(free_port()), "--slots", str(SLOTS), "--busy-ms", str(BUSY_MS), "--wait-ms", str(WAIT_MS),
                   "--enable_latency_logging", "true"],
                  f"http://127.0.0.1:{port}", "/v2/health/ready")


def plan(url: str, protocol: str, steps: tuple[int, ...], hold: float) -> str:
    return plan_text(f"kserve-{protocol}", url, protocol, f"{url}/metrics", steps, hold,
                     'model = "spin"\nshape = [1, 8]\n')


def kserve_run(ks: Installed, out: Path, protocol: str, steps: tuple[int, ...], hold: float) -> KServeRun:
    server = start(ks)
    try:
        before = scrape(server.url + "/metrics")
        run = kneeswarm_run(plan(server.url, protocol, steps, hold), out, "--pid", str(server.pid))
        time.sleep(1.0)
        after = scrape(server.url + "/metrics")
    finally:
        server.stop()
    return KServeRun(ks, run, list(server.lines), before, after)


@pytest.fixture(scope="module")
def v2(ks, tmp_path_factory) -> KServeRun:
    return kserve_run(ks, tmp_path_factory.mktemp("kserve-v2"), "kserve", STEPS, HOLD_S)


@pytest.fixture(scope="module")
def v1(ks, tmp_path_factory) -> KServeRun:
    """KServe's v1 protocol is TF Serving's REST shape: kneeswarm's `tfserving` protocol."""
    return kserve_run(ks, tmp_path_factory.mktemp("kserve-v1"), "tfserving", (1, 2), 5.0)


def predict_count(m: dict[str, float]) -> float:
    return sum(v for k, v in m.items() if k.split("{")[0] == f"{PREDICT}_count")


# One line per request in KServe's log (its trace of the handler's wall time):
# "kserve.trace kserve.io.v2.models.spin.infer: 0.0813 ['http_status:200', 'http_method:POST', 'time:wall']"
WALL_LINE = re.compile(r"kserve\.trace kserve\.io\.(v1\.models\.spin:predict|v2\.models\.spin\.infer): ([\d.]+) "
                       r"\['http_status:200'.*'time:wall'\]")


def server_requests(r: KServeRun) -> list[tuple[float, float]]:
    """[(when its log line arrived, the server's wall time in ms)] per successful request."""
    return [(t, float(m[2]) * 1000.0) for t, line in r.log if (m := WALL_LINE.search(line))]


@pytest.mark.parametrize("which", ["v2", "v1"])
def test_every_step_valid_and_no_errors(which, request):
    r: KServeRun = request.getfixturevalue(which)
    assert_every_step_valid(r.run.run_dir)


@pytest.mark.parametrize("which", ["v2", "v1"])
def test_requests_equal_the_server_counter_and_log(which, request):
    r: KServeRun = request.getfixturevalue(which)
    rows, steps = rows_and_steps(r.run.run_dir)
    served = predict_count(r.after) - predict_count(r.before)
    stamps = [t for t, _ in server_requests(r)]
    assert len(stamps) == served, (len(stamps), served)  # the log and the counter agree
    assert 0 <= served - len(rows) <= max(STEPS), (served, len(rows))
    figs = per_step_counts(rows, steps, stamps)
    record_counts(f"kserve {which}", figs)


@pytest.mark.parametrize("which", ["v2", "v1"])
def test_client_p50_at_least_the_server_p50(which, request):
    """The server's own wall time per request (its log), over each step's steady window."""
    r: KServeRun = request.getfixturevalue(which)
    s = read_summary(r.run.run_dir)
    srv = server_requests(r)
    figs = []
    for st in s["steps"]:
        own = [ms for t, ms in srv if st["t_lo"] <= t < st["t_hi"]]
        server_p50 = float(np.percentile(own, 50))
        figs.append((st["users"], st["p50_ms"], server_p50))
        assert st["p50_ms"] >= server_p50, (st["users"], st["p50_ms"], server_p50)
    knee = s["knee"]["users"] if s.get("knee") else None
    FIGURES.setdefault(f"kserve {which}", {}).update({
        "server": f"KServe Python model server ({'v2 infer' if which == 'v2' else 'v1 predict'})",
        "version": r.installed.version, "protocol": "kserve (v2)" if which == "v2" else "tfserving (KServe v1)",
        "P50 ms client/server": " ".join(f"{u}u {c:.0f}/{v:.0f}" for u, c, v in figs),
        "knee (users)": str(knee), "expected knee": str(KNEE) if which == "v2" else "- (2 steps)",
        "cold install s": str(r.installed.cold_s), "run s": f"{r.run.seconds:.0f}"})


def test_knee_at_the_known_concurrency(v2):
    s = read_summary(v2.run.run_dir)
    assert s["knee"] is not None and s["knee"]["users"] == KNEE, [(st["users"], st["qps"]) for st in s["steps"]]


def test_target_metrics_matched_on_the_live_scrape(v2):
    s = read_summary(v2.run.run_dir)
    used = {k: v for host in s["target_series"].values() for k, v in host.items()}
    assert {k for k, v in used.items() if v["server"] == "kserve"} >= {"requests_s", "predict_ms", "preprocess_ms",
                                                                        "postprocess_ms"}, used
    for st in s["steps"]:
        t = target_of(st)
        # the server's request rate over the steady window is the client's QPS (the server counts
        # answers as they end, the client requests as they start: they differ by up to a
        # latency's worth of the window)
        rel = 0.05 + st["p50_ms"] / 1000.0 / st["window_s"]
        assert t["requests_s"] == pytest.approx(st["qps"], rel=rel), (st["users"], t, st["qps"])
        # its predict time holds at least the model's BUSY_MS + WAIT_MS
        assert t["predict_ms"] >= BUSY_MS + WAIT_MS, (st["users"], t)


def test_findings_of_a_slot_bound_server(v2):
    """The model's slots, not the CPU, bound this server: beyond the knee requests wait, the one
    Python process stays far from a core (SLOTS x BUSY_MS / (BUSY_MS + WAIT_MS) = 16 % of one), so
    no CPU finding may blame it.  (A CPU-bound model would make `single_thread_bound` the
    expected finding, but its knee would then move with whatever else runs on the two cores.)"""
    s = read_summary(v2.run.run_dir)
    ids = {f["id"] for f in s["findings"]}
    assert not ids & {"single_thread_bound", "cpu_saturated", "threads_over_cores"}, sorted(ids)
    FIGURES.setdefault("kserve v2", {})["findings"] = ", ".join(sorted(ids)) or "none"

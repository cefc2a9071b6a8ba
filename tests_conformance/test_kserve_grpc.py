"""KServe's Python model server over gRPC (its v2 / Open Inference Protocol service), driven by a
real `kneeswarm run` with ``kserve-grpc`` and checked against the server's own numbers.

The model is test_kserve.py's (kserve_model.py): at most SLOTS requests at once, each BUSY_MS of
the event loop's CPU and WAIT_MS without it, so a closed loop saturates at SLOTS users (the KNEE).
The truths are the server's: its /metrics (request_predict_seconds_count: one per request, gRPC's
as REST's) and its log's line per gRPC call ("grpc method: .../ModelInfer", written as the call
arrives, with the server's own time to the millisecond).
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass

import pytest

from conftest import (FIGURES, assert_every_step_valid, kneeswarm_run, per_step_counts, plan_text, read_summary,
                      record_counts, rows_and_steps, scrape, target_of, Run)
from servers import Installed, Server, free_port, kserve
from test_kserve import BUSY_MS, KNEE, SLOTS, WAIT_MS, predict_count

SERVER_INSTALL = kserve  # installed with the others before the first test (conftest.py)

pytestmark = pytest.mark.slow

STEPS = (1, 2, 4, 8, 16)
HOLD_S = 8.0
CALL_LINE = "grpc method: /inference.GRPCInferenceService/ModelInfer"


@dataclass
class KServeGrpcRun:
    installed: Installed
    run: Run
    log: list[tuple[float, str]]
    served: float  # request_predict_seconds_count over the run


@pytest.fixture(scope="module")
def ks() -> Installed:
    return kserve()


@pytest.fixture(scope="module")
def grpc_run(ks, tmp_path_factory) -> KServeGrpcRun:
    from pathlib import Path

    port, gport = free_port(), free_port()
    server = Server([str(ks.paths["python"]), str(Path(__file__).with_name("kserve_model.py")), "--http_port",
                     str(port), "--grpc_port", str(gport), "--slots", str(SLOTS), "--busy-ms", str(BUSY_MS),
                     "--wait-ms", str(WAIT_MS)], f"http://127.0.0.1:{port}", "/v2/health/ready")
    try:
        before = predict_count(scrape(server.url + "/metrics"))
        plan = plan_text("kserve-grpc", f"grpc://127.0.0.1:{gport}", "kserve-grpc", f"{server.url}/metrics", STEPS,
                         HOLD_S, 'model = "spin"\nshape = [1, 8]\n')
        run = kneeswarm_run(plan, tmp_path_factory.mktemp("kserve-grpc") / "out", "--pid", str(server.pid))
        time.sleep(1.0)
        after = predict_count(scrape(server.url + "/metrics"))
    finally:
        server.stop()
    return KServeGrpcRun(ks, run, list(server.lines), after - before)


def test_every_step_valid_and_the_knee(grpc_run):
    s = assert_every_step_valid(grpc_run.run.run_dir)
    knee = s["knee"]["users"] if s.get("knee") else None
    FIGURES.setdefault("kserve grpc", {}).update({
        "server": "KServe Python model server (v2 over gRPC, ModelInfer)", "version": grpc_run.installed.version,
        "protocol": "kserve-grpc", "P50 ms client/server": " ".join(f"{st['users']}u {st['p50_ms']:.0f}/-"
                                                                   for st in s["steps"]),
        "knee (users)": str(knee), "expected knee": str(KNEE),
        "findings": ", ".join(sorted(f["id"] for f in s["findings"])) or "none",
        "cold install s": str(grpc_run.installed.cold_s), "run s": f"{grpc_run.run.seconds:.0f}"})
    assert knee == KNEE, [(st["users"], st["qps"]) for st in s["steps"]]


def test_requests_equal_the_server_counter_and_log(grpc_run):
    rows, steps = rows_and_steps(grpc_run.run.run_dir)
    # "2026-12-05 10:45:02.473 8628 kserve INFO [interceptors.py:...] grpc method: ...": the server's local time
    calls = [dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S.%f").timestamp()
             for _, line in grpc_run.log if CALL_LINE in line]
    assert len(calls) == grpc_run.served, (len(calls), grpc_run.served)  # the log and the counter agree
    # the preflight's one request; those in flight when the load stopped (at most one per user)
    assert 0 <= grpc_run.served - 1 - len(rows) <= max(STEPS), (grpc_run.served, len(rows))
    record_counts("kserve grpc", per_step_counts(rows, steps, calls, by="start"))


def test_target_metrics_matched_on_the_live_scrape(grpc_run):
    """The server's metrics port, scraped as for any run: its request rate is the client's QPS."""
    s = read_summary(grpc_run.run.run_dir)
    used = {k: v for host in s["target_series"].values() for k, v in host.items()}
    assert {k for k, v in used.items() if v["server"] == "kserve"} >= {"requests_s"}, used
    for st in s["steps"]:
        t = target_of(st)
        rel = 0.05 + st["p50_ms"] / 1000.0 / st["window_s"]  # ends vs starts at the window's edges
        assert t["requests_s"] == pytest.approx(st["qps"], rel=rel), (st["users"], t, st["qps"])

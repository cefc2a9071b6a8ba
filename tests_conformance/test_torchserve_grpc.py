"""TorchServe over gRPC (its InferenceAPIsService), driven by a real `kneeswarm run` with
``torchserve-grpc`` and checked against the server's own numbers.

Two models on one TorchServe: "echo" (torchserve_handler.py, SERVICE_MS per request, WORKERS
workers: a closed loop saturates at WORKERS users, the KNEE), sent ``Predictions``; and "stream"
(torchserve_stream_handler.py: RESPONSES answers, the first FIRST_MS after the request, then PACE_MS
apart), sent ``StreamPredictions``.  The truths are the server's: its access log (one line per gRPC
call, with its own time in ms, written when the call ends), its Prometheus counter
(ts_inference_requests_total per model) and the streaming handler's own times ("streamed" lines in
the model log).
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

from conftest import (FIGURES, assert_every_step_valid, kneeswarm_run, per_step_counts, plan_text, read_summary,
                      record_counts, rows_and_steps, scrape, target_of, Run)
from servers import Installed, free_port, torchserve, torchserve_server
from test_torchserve import KNEE, SERVICE_MS, WORKERS

SERVER_INSTALL = torchserve  # installed with the others before the first test (conftest.py)

pytestmark = pytest.mark.slow

STEPS = (1, 2, 4, 8, 16)
HOLD_S = 8.0
STREAM_STEPS = (2, 4)  # within the stream model's workers: every request is served at once
RESPONSES, PACE_MS, FIRST_MS = 8, 40.0, 200.0  # torchserve_stream_handler.py's
TIMING_REL = 0.10
ACCESS_FLUSH_S = 20.0  # the longest the access log's last lines are waited for
SERVICE = "org.pytorch.serve.grpc.inference.InferenceAPIsService"
# log4j2's access log: '2026-12-05T10:46:05,091 - /127.0.0.1:40060 "gRPC <service>/Predictions HTTP/2.0" 0 57'
ACCESS = re.compile(r'^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d,\d{3}) - \S+ "gRPC ' + re.escape(SERVICE) + r'/(\w+) HTTP/2.0" 0 (\d+)')


@dataclass
class TSGrpcRun:
    run: Run
    access: list[tuple[float, str, float]]  # (when the frontend wrote its line, the method, its ms)
    counted: float  # ts_inference_requests_total of the model over the run


def read_access(path: Path, t0: float) -> list[tuple[float, str, float]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        m = ACCESS.match(line)
        if m and (t := dt.datetime.strptime(m[1], "%Y-%m-%dT%H:%M:%S,%f").timestamp()) >= t0:
            out.append((t, m[2], float(m[3])))
    return out


def counted(m: dict[str, float], model: str) -> float:
    return sum(v for k, v in m.items() if k.split("{")[0] == "ts_inference_requests_total" and f'model_name="{model}"' in k)


@pytest.fixture(scope="module")
def ts() -> Installed:
    return torchserve()


@pytest.fixture(scope="module")
def server(ts, tmp_path_factory):
    home = tmp_path_factory.mktemp("torchserve-grpc")
    here = Path(__file__).parent
    gport = free_port()
    handlers = {"echo": here / "torchserve_handler.py", "stream": here / "torchserve_stream_handler.py"}
    srv, mport = torchserve_server(ts, home, handlers, WORKERS,
                                   f"grpc_inference_address=127.0.0.1\ngrpc_inference_port={gport}\n"
                                   f"grpc_management_address=127.0.0.1\ngrpc_management_port={free_port()}\n")
    try:
        deadline = time.monotonic() + 120  # /ping is healthy before the workers are up
        for model in ("echo", "stream"):
            while time.monotonic() < deadline and requests.post(f"{srv.url}/predictions/{model}", json={"data": [1]},
                                                                timeout=30).status_code != 200:
                time.sleep(0.5)
        yield srv, f"grpc://127.0.0.1:{gport}", f"http://127.0.0.1:{mport}/metrics", home
    finally:
        srv.stop()


def ts_run(server, name: str, plan: str, model: str) -> TSGrpcRun:
    srv, _, metrics, home = server
    t0, before = time.time(), counted(scrape(metrics), model)
    run = kneeswarm_run(plan, home / name, "--pid", str(srv.serving_pid("java")))
    time.sleep(1.0)
    n = counted(scrape(metrics), model) - before
    method = "StreamPredictions" if model == "stream" else "Predictions"
    deadline = time.monotonic() + ACCESS_FLUSH_S  # log4j writes the access log in batches: wait for its lines
    while True:
        access = read_access(home / "logs" / "access_log.log", t0)
        if sum(m == method for _, m, _ in access) >= n - max(STEPS) or time.monotonic() > deadline:
            return TSGrpcRun(run, access, n)
        time.sleep(0.5)


@pytest.fixture(scope="module")
def unary(server) -> TSGrpcRun:
    plan = plan_text("torchserve-grpc", server[1], "torchserve-grpc", server[2], STEPS, HOLD_S,
                     'model = "echo"\nshape = [1, 8]\n')
    return ts_run(server, "unary", plan, "echo")


@pytest.fixture(scope="module")
def stream(server) -> TSGrpcRun:
    plan = plan_text("torchserve-grpc-stream", server[1], "torchserve-grpc", server[2], STREAM_STEPS, HOLD_S,
                     'model = "stream"\nrpc = "StreamPredictions"\n').replace("min_requests = 30", "min_requests = 10")
    return ts_run(server, "stream", plan, "stream")


def test_predictions_every_step_valid_and_the_knee(unary, ts):
    s = assert_every_step_valid(unary.run.run_dir)
    figs = []
    for st in s["steps"]:
        own = [ms for t, method, ms in unary.access if method == "Predictions" and st["t_lo"] <= t < st["t_hi"]]
        server_p50 = float(np.percentile(own, 50))
        figs.append((st["users"], st["p50_ms"], server_p50))
        assert st["p50_ms"] >= server_p50 - 1.0, figs  # the access log's time is in whole ms
    knee = s["knee"]["users"] if s.get("knee") else None
    FIGURES.setdefault("torchserve grpc", {}).update({
        "server": f"TorchServe over gRPC ({WORKERS} workers, {SERVICE_MS:.0f} ms handler)", "version": ts.version,
        "protocol": "torchserve-grpc (Predictions)",
        "P50 ms client/server": " ".join(f"{u}u {c:.0f}/{v:.0f}" for u, c, v in figs), "knee (users)": str(knee),
        "expected knee": str(KNEE), "findings": ", ".join(sorted(f["id"] for f in s["findings"])) or "none",
        "cold install s": str(ts.cold_s), "run s": f"{unary.run.seconds:.0f}"})
    assert knee == KNEE, [(st["users"], st["qps"]) for st in s["steps"]]


def test_predictions_rows_are_the_access_log_and_the_counter(unary):
    rows, steps = rows_and_steps(unary.run.run_dir)
    logged = [t for t, method, _ in unary.access if method == "Predictions"]
    # the counter counts every prediction the handler ran; the access log a call answered: the calls in
    # flight when the load stopped (at most one per user) were run, but their callers were gone
    assert 0 <= unary.counted - len(logged) <= max(STEPS), (len(logged), unary.counted)
    # the preflight's one prediction; those in flight when the load stopped (at most one per user)
    assert 0 <= len(logged) - 1 - len(rows) <= max(STEPS), (len(logged), len(rows))
    record_counts("torchserve grpc", per_step_counts(rows, steps, logged))


def test_stream_predictions_timed_against_the_handlers_own(stream, server, ts):
    s = assert_every_step_valid(stream.run.run_dir)
    rows, steps = rows_and_steps(stream.run.run_dir)
    logged = [t for t, method, _ in stream.access if method == "StreamPredictions"]
    assert 0 <= len(logged) - 1 - len(rows) <= max(STREAM_STEPS), (len(logged), len(rows))
    assert (rows["chunks_out"] == RESPONSES).all() and rows["tokens_counted"].all()
    t0 = rows["t_start"].min() - 5.0
    model = [[float(x) for x in line.split("streamed ", 1)[1].split()]
             for line in (server[3] / "logs" / "model_log.log").read_text(errors="replace").splitlines()
             if "streamed " in line]
    model = [m for m in model if m[0] >= t0]
    figs = []
    for st in s["steps"]:
        mine = rows[(rows["t_start"] >= st["t_lo"]) & (rows["t_start"] < st["t_hi"])]
        own = [m for m in model if st["t_lo"] <= m[0] < st["t_hi"]]
        model_ttft = float(np.median([(m[1] - m[0]) * 1000.0 for m in own]))
        model_itl = float(np.median(np.concatenate([np.diff(m[1:]) * 1000.0 for m in own])))
        ttft, itl = float(mine["ttft_ms"].median()), float(np.median(np.concatenate(mine["itl_ms"].to_numpy())))
        figs.append((st["users"], ttft, model_ttft, itl, model_itl))
        assert ttft == pytest.approx(model_ttft, rel=TIMING_REL), figs
        assert itl == pytest.approx(model_itl, rel=TIMING_REL), figs
    FIGURES.setdefault("torchserve grpc stream", {}).update({
        "server": f"TorchServe over gRPC, streaming handler ({RESPONSES} answers, {FIRST_MS:.0f} ms then "
                  f"{PACE_MS:.0f} ms apart)", "version": ts.version, "protocol": "torchserve-grpc (StreamPredictions)",
        "P50 ms client/server": " ".join(f"{u}u TTFT {a:.1f}/{b:.1f} ITL {c:.1f}/{d:.1f}" for u, a, b, c, d in figs),
        "cold install s": str(ts.cold_s), "run s": f"{stream.run.seconds:.0f}"})
    record_counts("torchserve grpc stream", per_step_counts(rows, steps, logged))


def test_target_metrics_matched_on_the_live_scrape(unary):
    """The server's metrics port, scraped as for any run: its request rate is the client's QPS."""
    s = read_summary(unary.run.run_dir)
    used = {k: v for host in s["target_series"].values() for k, v in host.items()}
    assert {k for k, v in used.items() if v["server"] == "torchserve"} >= {"requests_s"}, used
    for st in s["steps"]:
        t = target_of(st)
        rel = 0.05 + st["p50_ms"] / 1000.0 / st["window_s"]  # ends vs starts at the window's edges
        assert t["requests_s"] == pytest.approx(st["qps"], rel=rel), (st["users"], t, st["qps"])

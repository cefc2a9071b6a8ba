"""Triton Inference Server over gRPC (the tritonserver bundled in nvidia-pytriton, CPU, Python
backend): ``kserve-grpc`` (ModelInfer) and ``triton-stream`` (ModelStreamInfer on a decoupled
model), each driven by a real `kneeswarm run` and checked against the server's own numbers.

The models (pytriton_model.py): "double", INSTANCES instances of SERVICE_MS each, no batching -- a
closed loop saturates at INSTANCES users (the KNEE); "tokens", decoupled, RESPONSES responses per
request, the first FIRST_MS after the request reached the model, the rest PACE_MS apart.  The truths
are the server's: its metrics (nv_inference_request_success per model), its models' own line per
request ("served", and for the stream every response's time: "streamed").
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pytest

from conftest import (FIGURES, assert_every_step_valid, kneeswarm_run, per_step_counts, plan_text, read_summary,
                      record_counts, rows_and_steps, scrape, target_of, Run)
from servers import Installed, pytriton, pytriton_server

SERVER_INSTALL = pytriton  # installed with the others before the first test (conftest.py)

pytestmark = pytest.mark.slow

INSTANCES, SERVICE_MS = 4, 50.0
KNEE = INSTANCES
STEPS = (1, 2, 4, 8, 16)
HOLD_S = 8.0
RESPONSES, PACE_MS, FIRST_MS = 8, 40.0, 200.0
STREAM_STEPS = (2, 4)  # within the model's instances: every request is served at once
TIMING_REL = 0.10  # TTFT and ITL within 10 % of the model's own


@dataclass
class GrpcRun:
    run: Run
    lines: list[tuple[float, str]]  # the server's lines that arrived during the run
    success: dict[str, float]  # nv_inference_request_success per model, over the run


def success(m: dict[str, float], model: str) -> float:
    return sum(v for k, v in m.items() if k.split("{")[0] in ("nv_inference_request_success",
                                                               "nv_inference_request_success_total")
               and f'model="{model}"' in k)


@pytest.fixture(scope="module")
def tr() -> Installed:
    return pytriton()


@pytest.fixture(scope="module")
def triton(tr, tmp_path_factory):
    home = tmp_path_factory.mktemp("triton-grpc")
    started = pytriton_server(tr, [str(INSTANCES), str(SERVICE_MS), str(RESPONSES), str(PACE_MS), str(FIRST_MS)],
                              "/v2/models/tokens/ready", home)
    server = started.server
    try:
        yield server, f"grpc://127.0.0.1:{started.grpc}", f"http://127.0.0.1:{started.metrics}/metrics", home
    finally:
        server.stop()


def grpc_run(triton, name: str, plan: str, model: str) -> GrpcRun:
    server, _, metrics, home = triton
    before, t0 = scrape(metrics), time.time()
    n0 = len(server.lines)
    run = kneeswarm_run(plan, home / name, "--pid", str(server.serving_pid("tritonserver")))
    time.sleep(2.5)  # Triton refreshes some metrics every 2 s
    after = scrape(metrics)
    lines = [(t, line) for t, line in server.lines[n0:] if t >= t0]
    return GrpcRun(run, lines, {model: success(after, model) - success(before, model)})


@pytest.fixture(scope="module")
def unary(triton) -> GrpcRun:
    plan = plan_text("triton-grpc", triton[1], "kserve-grpc", triton[2], STEPS, HOLD_S,
                     'model = "double"\ninput_name = "x"\nshape = [1, 8]\n')
    return grpc_run(triton, "unary", plan, "double")


@pytest.fixture(scope="module")
def stream(triton) -> GrpcRun:
    plan = plan_text("triton-stream", triton[1], "triton-stream", triton[2], STREAM_STEPS, HOLD_S,
                     'model = "tokens"\n[[request.inputs]]\nname = "text_input"\ndatatype = "BYTES"\nshape = [1]\n'
                     'data = ["{{prompt}}"]\n').replace("min_requests = 30", "min_requests = 10")
    return grpc_run(triton, "stream", plan, "tokens")


def test_unary_every_step_valid_and_the_knee(unary, tr):
    s = assert_every_step_valid(unary.run.run_dir)
    knee = s["knee"]["users"] if s.get("knee") else None
    served = [(t, float(line.split()[2])) for t, line in unary.lines if line.startswith("served ")]
    figs = []
    for st in s["steps"]:
        server_p50 = float(np.percentile([ms for t, ms in served if st["t_lo"] <= t < st["t_hi"]], 50))
        figs.append((st["users"], st["p50_ms"], server_p50))
        assert st["p50_ms"] >= server_p50, figs
    FIGURES.setdefault("triton grpc", {}).update({
        "server": f"Triton via nvidia-pytriton over gRPC ({INSTANCES} instances, {SERVICE_MS:.0f} ms)",
        "version": f"pytriton {tr.version} (tritonserver 2.51.0)", "protocol": "kserve-grpc",
        "P50 ms client/server": " ".join(f"{u}u {c:.0f}/{v:.0f}" for u, c, v in figs),
        "knee (users)": str(knee), "expected knee": str(KNEE),
        "findings": ", ".join(sorted(f["id"] for f in s["findings"])) or "none",
        "cold install s": str(tr.cold_s), "run s": f"{unary.run.seconds:.0f}"})
    assert knee == KNEE, [(st["users"], st["qps"]) for st in s["steps"]]


def test_unary_requests_equal_the_server_counter_and_its_model(unary):
    rows, steps = rows_and_steps(unary.run.run_dir)
    served = [t for t, line in unary.lines if line.startswith("served ")]
    assert len(served) == unary.success["double"], (len(served), unary.success)
    # the preflight's one request, and those in flight when the load stopped (at most one per user)
    assert 0 <= len(served) - 1 - len(rows) <= max(STEPS), (len(served), len(rows))
    record_counts("triton grpc", per_step_counts(rows, steps, served))


def test_stream_responses_per_request_and_the_servers_count(stream):
    s = assert_every_step_valid(stream.run.run_dir)
    rows, steps = rows_and_steps(stream.run.run_dir)
    streamed = [line for _, line in stream.lines if line.startswith("streamed ")]
    assert len(streamed) == stream.success["tokens"], (len(streamed), stream.success)
    assert 0 <= len(streamed) - 1 - len(rows) <= max(STREAM_STEPS), (len(streamed), len(rows))
    assert (rows["chunks_out"] == RESPONSES).all() and (rows["tokens_out"] == RESPONSES).all()
    assert all(st["ttft_p50_ms"] is not None for st in s["steps"])


def test_stream_ttft_and_itl_are_the_models_own(stream, tr):
    """Per step, the client's TTFT and ITL medians within 10 % of the model's own (its first
    response's time after the request reached it; the gaps between its responses)."""
    s = read_summary(stream.run.run_dir)
    rows, _ = rows_and_steps(stream.run.run_dir)
    model = [[float(x) for x in line.split()[1:]] for _, line in stream.lines if line.startswith("streamed ")]
    figs = []
    for st in s["steps"]:
        mine = rows[(rows["t_start"] >= st["t_lo"]) & (rows["t_start"] < st["t_hi"])]
        own = [m for m in model if st["t_lo"] <= m[0] < st["t_hi"]]
        model_ttft = float(np.median([(m[1] - m[0]) * 1000.0 for m in own]))
        model_itl = float(np.median(np.concatenate([np.diff(m[1:]) * 1000.0 for m in own])))
        ttft = float(mine["ttft_ms"].median())
        itl = float(np.median(np.concatenate(mine["itl_ms"].to_numpy())))
        figs.append((st["users"], ttft, model_ttft, itl, model_itl))
        assert ttft == pytest.approx(model_ttft, rel=TIMING_REL), figs
        assert itl == pytest.approx(model_itl, rel=TIMING_REL), figs
    FIGURES.setdefault("triton stream", {}).update({
        "server": f"Triton via nvidia-pytriton, decoupled model ({RESPONSES} responses, {FIRST_MS:.0f} ms then "
                  f"{PACE_MS:.0f} ms apart)", "version": f"pytriton {tr.version} (tritonserver 2.51.0)",
        "protocol": "triton-stream",
        "P50 ms client/server": " ".join(f"{u}u TTFT {a:.1f}/{b:.1f} ITL {c:.1f}/{d:.1f}" for u, a, b, c, d in figs),
        "cold install s": str(tr.cold_s), "run s": f"{stream.run.seconds:.0f}"})
    rows, steps = rows_and_steps(stream.run.run_dir)
    ends = [m[-1] for m in model]
    record_counts("triton stream", per_step_counts(rows, steps, ends))


def test_target_metrics_matched_on_the_live_scrape(unary):
    """Triton's metrics port, scraped as for any run: its request rate is the client's QPS, its
    server latency at least the model's."""
    s = read_summary(unary.run.run_dir)
    used = {k: v for host in s["target_series"].values() for k, v in host.items()}
    assert {k for k, v in used.items() if v["server"] == "triton"} >= {"requests_s", "server_latency_ms"}, used
    for st in s["steps"]:
        t = target_of(st)
        rel = 0.05 + st["p50_ms"] / 1000.0 / st["window_s"]  # ends vs starts at the window's edges
        assert t["requests_s"] == pytest.approx(st["qps"], rel=rel), (st["users"], t, st["qps"])
        assert t["server_latency_ms"] >= SERVICE_MS, (st["users"], t)

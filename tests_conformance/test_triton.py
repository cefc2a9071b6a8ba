"""Triton Inference Server (the tritonserver bundled in nvidia-pytriton, CPU, Python backend),
KServe v2 protocol, driven by a real `kneeswarm run` and checked against the server's own numbers.

The model (pytriton_model.py): INSTANCES instances of SERVICE_MS each, no batching -- a closed
loop saturates at INSTANCES users (the KNEE).  The truths are the server's: its metrics
(nv_inference_request_success, nv_inference_request_duration_us) and its model's own line per
request served, stamped by this test as it arrives.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pytest

from conftest import (
    FIGURES, assert_every_step_valid, kneeswarm_run, per_step_counts, plan_text, read_summary, record_counts, scrape,
    rows_and_steps, Run, target_of)
from servers import Installed, pytriton, pytriton_server

SERVER_INSTALL = pytriton  # installed with the others before the first test (conftest.py)

pytestmark = pytest.mark.slow

INSTANCES, SERVICE_MS = 4, 50.0
KNEE = INSTANCES
STEPS = (1, 2, 4, 8, 16)
HOLD_S = 8.0


@dataclass
class TritonRun:
    installed: Installed
    run: Run
    served: list[tuple[float, float]]  # (when the model's line arrived, its own ms) per request
    before: dict[str, float]
    after: dict[str, float]
    t_before: float


def success(m: dict[str, float]) -> float:
    return sum(v for k, v in m.items() if k.split("{")[0] in ("nv_inference_request_success",
                                                               "nv_inference_request_success_total"))


@pytest.fixture(scope="module")
def tr() -> Installed:
    return pytriton()


@pytest.fixture(scope="module")
def triton_run(tr, tmp_path_factory) -> TritonRun:
    home = tmp_path_factory.mktemp("triton")
    started = pytriton_server(tr, [str(INSTANCES), str(SERVICE_MS)], "/v2/models/tokens/ready", home)  # bound last
    server, metrics = started.server, f"http://127.0.0.1:{started.metrics}/metrics"  # (both models loaded)
    try:
        t_before, before = time.time(), scrape(metrics)
        plan = plan_text("triton", server.url, "kserve", metrics, STEPS, HOLD_S,
                         'model = "double"\ninput_name = "x"\nshape = [1, 8]\n')
        # the monitored process: tritonserver itself (pytriton's Python process only launched it)
        run = kneeswarm_run(plan, home / "out", "--pid", str(server.serving_pid("tritonserver")))
        time.sleep(2.5)  # Triton refreshes some metrics every 2 s
        after = scrape(metrics)
    finally:
        server.stop()
    served = []
    for t, line in server.lines:
        if line.startswith("served "):
            served.append((t, float(line.split()[2])))
    return TritonRun(tr, run, served, before, after, t_before)


def test_every_step_valid_and_no_errors(triton_run):
    assert_every_step_valid(triton_run.run.run_dir)


def test_requests_equal_the_server_counter_and_its_model(triton_run):
    rows, steps = rows_and_steps(triton_run.run.run_dir)
    n = success(triton_run.after) - success(triton_run.before)
    stamps = [t for t, _ in triton_run.served if t >= triton_run.t_before]
    assert len(stamps) == n, (len(stamps), n)
    assert 0 <= n - len(rows) <= max(STEPS), (n, len(rows))
    figs = per_step_counts(rows, steps, stamps)
    record_counts("triton", figs)


def test_client_p50_at_least_the_server_p50_and_the_knee(triton_run):
    s = read_summary(triton_run.run.run_dir)
    figs = []
    for st in s["steps"]:
        own = [ms for t, ms in triton_run.served if st["t_lo"] <= t < st["t_hi"]]
        server_p50 = float(np.percentile(own, 50))
        figs.append((st["users"], st["p50_ms"], server_p50))
        assert st["p50_ms"] >= server_p50, (st["users"], st["p50_ms"], server_p50)
    knee = s["knee"]["users"] if s.get("knee") else None
    ids = sorted(f["id"] for f in s["findings"])
    FIGURES.setdefault("triton", {}).update({
        "server": f"Triton via nvidia-pytriton ({INSTANCES} Python-backend instances, {SERVICE_MS:.0f} ms)",
        "version": f"pytriton {triton_run.installed.version} (tritonserver 2.51.0)", "protocol": "kserve (v2)",
        "P50 ms client/server": " ".join(f"{u}u {c:.0f}/{v:.0f}" for u, c, v in figs),
        "knee (users)": str(knee), "expected knee": str(KNEE), "findings": ", ".join(ids) or "none",
        "cold install s": str(triton_run.installed.cold_s), "run s": f"{triton_run.run.seconds:.0f}"})
    assert knee == KNEE, [(st["users"], st["qps"]) for st in s["steps"]]


def test_target_metrics_matched_on_the_live_scrape(triton_run):
    s = read_summary(triton_run.run.run_dir)
    used = {k: v for host in s["target_series"].values() for k, v in host.items()}
    assert {k for k, v in used.items() if v["server"] == "triton"} >= {"requests_s", "server_latency_ms",
                                                                        "queue_wait_ms"}, used
    for st in s["steps"]:
        t = target_of(st)
        rel = 0.05 + st["p50_ms"] / 1000.0 / st["window_s"]  # ends vs starts at the window's edges
        assert t["requests_s"] == pytest.approx(st["qps"], rel=rel), (st["users"], t, st["qps"])
        assert t["server_latency_ms"] >= SERVICE_MS, (st["users"], t)

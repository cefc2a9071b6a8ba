"""KServe's Python model server (v2 protocol, and v1 through the `tfserving` protocol's path),
driven by a real `kneeswarm run` and checked against the server's own numbers.

The model (kserve_model.py) holds the server's one event loop for BUSY_MS of CPU per request and
then waits WAIT_MS without it: one process, one busy thread, so a closed loop saturates at about
(BUSY_MS + WAIT_MS) / (BUSY_MS + the server's own cost) users -- KNEE users -- and above it QPS
holds while latency grows.  The truths are the server's: its /metrics
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
import requests

from conftest import FIGURES, Run, kneeswarm_run, per_step_counts, read_summary, rows_and_steps, target_of
from servers import Installed, Server, free_port, kserve

pytestmark = pytest.mark.slow

BUSY_MS, WAIT_MS = 20.0, 60.0
KNEE = 4  # (20 + 60) / (20 + ~2 ms of KServe's own) ~ 3.6: QPS rises to 4 users and holds after
STEPS = (1, 2, 4, 8, 16)
HOLD_S = 8.0
PREDICT = "request_predict_seconds"


def scrape(url: str) -> dict[str, float]:
    from collectors.prometheus import parse_exposition

    return parse_exposition(requests.get(url + "/metrics", timeout=5).text)


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
                   "--grpc_port", str(free_port()), "--busy-ms", str(BUSY_MS), "--wait-ms", str(WAIT_MS),
                   "--enable_latency_logging", "true"],
                  f"http://127.0.0.1:{port}", "/v2/health/ready")


def plan(url: str, protocol: str, steps: tuple[int, ...], hold: float) -> str:
    return f"""name = "kserve-{protocol}"
target = "{url}"
protocol = "{protocol}"
metrics_url = "{url}/metrics"

[load]
steps = [{", ".join(map(str, steps))}]
ramp = 1.0
hold = {hold}
settle = 1.0
workers = 2

[request]
model = "spin"
shape = [1, 8]

[analysis]
min_requests = 30
"""


def kserve_run(ks: Installed, out: Path, protocol: str, steps: tuple[int, ...], hold: float) -> KServeRun:
    server = start(ks)
    try:
        before = scrape(server.url)
        run = kneeswarm_run(plan(server.url, protocol, steps, hold), out, "--pid", str(server.pid))
        time.sleep(1.0)
        after = scrape(server.url)
    finally:
        server.stop()
    return KServeRun(ks, run, list(server.lines), before, after)


@pytest.fixture(scope="module")
def v2(ks, tmp_path_factory) -> KServeRun:
    return kserve_run(ks, tmp_path_factory.mktemp("kserve-v2"), "kserve", STEPS, HOLD_S)


def predict_count(m: dict[str, float]) -> float:
    return sum(v for k, v in m.items() if k.split("{")[0] == f"{PREDICT}_count")


# One line per request in KServe's log (--enable_latency_logging): "requestId: ..., preprocess_ms: ...,
# explain_ms: ..., predict_ms: ..., postprocess_ms: ..."
LATENCY_LINE = re.compile(r"predict_ms:\s*([\d.]+)")


def test_every_step_valid_and_no_errors(v2):
    s = read_summary(v2.run.run_dir)
    assert s["complete"] is True, s.get("warnings")
    rows, _ = rows_and_steps(v2.run.run_dir)
    assert rows["ok"].all(), rows[~rows["ok"]].head()
    for st in s["steps"]:
        assert st["valid"] is True, (st["users"], st["reasons"])


def test_requests_equal_the_server_counter_and_log(v2):
    rows, steps = rows_and_steps(v2.run.run_dir)
    served = predict_count(v2.after) - predict_count(v2.before)
    stamps = [t for t, line in v2.log if LATENCY_LINE.search(line)]
    assert len(stamps) == served, (len(stamps), served)  # the log and the counter agree
    assert 0 <= served - len(rows) <= max(STEPS), (served, len(rows))
    figs = per_step_counts(rows, steps, stamps)
    FIGURES.setdefault("kserve v2", {})["requests client/server"] = (
        f"{sum(c for _, c, _ in figs)}/{sum(s for _, _, s in figs)}")


def test_knee_and_p50(v2):
    s = read_summary(v2.run.run_dir)
    by = {st["users"]: st for st in s["steps"]}
    knee = s["knee"]["users"] if s.get("knee") else None
    figs = " ".join(f"{u}u {st['p50_ms']:.0f}" for u, st in by.items())
    FIGURES.setdefault("kserve v2", {}).update({
        "server": "KServe Python model server (v2 infer)", "version": v2.installed.version, "protocol": "kserve (v2)",
        "P50 ms client/server": figs, "knee (users)": str(knee), "expected knee": str(KNEE),
        "cold install s": str(v2.installed.cold_s), "run s": f"{v2.run.seconds:.0f}"})
    assert knee == KNEE, [(st["users"], st["qps"]) for st in s["steps"]]

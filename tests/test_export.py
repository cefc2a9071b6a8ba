"""Live export (kneeswarm/launch/export.py, analysis/measure/live.py): real runs against the knee-mode demo target,
their figures taken off the wire -- an OTLP/HTTP receiver in this process decoding the
opentelemetry-proto messages, the Prometheus endpoint scraped while the run goes on -- and checked
against what summary.json reports for the same step.

Tolerances: the export and the summary compute each step's figures from the same request rows
with the same definitions (numpy's linear percentile, successes / window seconds), so they agree
to float rounding (rel 1e-9); Prometheus' text format writes Python's repr of a float and OTLP
carries IEEE doubles, neither loses a digit.  The summary itself is checked against numpy on the
run's rows and steps.csv in the test (code of neither), so both cannot be wrong the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

import pyarrow.parquet as pq
import pytest
import requests

from kneeswarm.collectors.prometheus import parse_exposition
from kneeswarm.launch.cli import start_target, stop_target
from tests.conftest import KNEESWARM, REPO, read_summary, run_cli

SLOTS, SERVICE_MS = 4, 50
REL = 1e-9


# -- an OTLP/HTTP receiver in the test process -----------------------------------------------------
class OtlpReceiver:
    """POST /v1/metrics (and /v1/traces, /v1/logs, answered and dropped) on loopback; every
    ExportMetricsServiceRequest decoded and kept with the time it arrived."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as pb

        self.requests: list[tuple[float, object]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/v1/metrics":
                    msg = pb.ExportMetricsServiceRequest()
                    msg.ParseFromString(body)
                    receiver.requests.append((time.time(), msg))
                    answer = pb.ExportMetricsServiceResponse().SerializeToString()
                else:
                    answer = b""
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *_a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def points(self) -> list[dict]:
        """Every data point received: service, metric name, kind, attributes, value or count, start."""
        out = []
        for t, msg in self.requests:
            for rm in msg.resource_metrics:
                service = {a.key: a.value.string_value for a in rm.resource.attributes}.get("service.name")
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        kind = m.WhichOneof("data")
                        for p in getattr(m, kind).data_points:
                            attrs = {a.key: a.value.string_value for a in p.attributes}
                            value = p.count if kind == "histogram" else (p.as_double if p.HasField("as_double") else p.as_int)
                            out.append({"t": t, "service": service, "name": m.name, "kind": kind, "attrs": attrs,
                                        "value": value, "start": p.start_time_unix_nano})
        return out


class Scraper:
    """GETs the Prometheus endpoint every ``period`` seconds in a thread; keeps each answer parsed."""

    def __init__(self, url: str, period: float = 0.5) -> None:
        self.url, self.period = url, period
        self.scrapes: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                text = requests.get(self.url, timeout=2).text
                self.scrapes.append((time.time(), parse_exposition(text)))
            except requests.RequestException:
                pass
            self._stop.wait(self.period)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(5)


def free_port() -> int:
    from kneeswarm.launch.conductor import free_port as fp

    return fp()


def series(scrape: dict[str, float], name: str) -> dict[str, float]:
    """{labels text: value} of one metric in a parsed scrape."""
    return {k[len(name):]: v for k, v in scrape.items() if k == name or k.startswith(name + "{")}


def step_value(scrape: dict[str, float], name: str, step: int) -> float | None:
    hits = [v for k, v in series(scrape, name).items() if f'step="{step}"' in k]
    return hits[0] if hits else None


def request_rows(run_dir: Path) -> int:
    return sum(pq.ParquetFile(p).metadata.num_rows for p in sorted((run_dir / "requests").glob("part-*.parquet")))


def assert_step_figures_match(scrape: dict[str, float], st: dict, i: int) -> None:
    assert step_value(scrape, "kneeswarm_step_final", i) == 1.0
    assert step_value(scrape, "kneeswarm_step_requests", i) == st["requests"]
    assert step_value(scrape, "kneeswarm_step_qps", i) == pytest.approx(st["qps"], rel=REL)
    assert step_value(scrape, "kneeswarm_step_p99_ms", i) == pytest.approx(st["p99_ms"], rel=REL)


def check_rows_truth(summary: dict, run_dir: Path, settle: float = 1.0) -> None:
    """numpy on the run's own rows and steps.csv, code of neither the export nor the summary:
    each step's successes in [t_steady + settle, t_end) per second and their P99."""
    import numpy as np
    import pandas as pd

    rows = pd.concat([pq.read_table(p, columns=["t_start", "latency_ms", "ok", "step"]).to_pandas()
                      for p in sorted((run_dir / "requests").glob("part-*.parquet"))])
    for _, s in pd.read_csv(run_dir / "steps.csv").iterrows():
        lo, hi = s["t_steady"] + settle, s["t_end"]
        mine = rows[(rows["step"] == s["index"]) & (rows["t_start"] >= lo) & (rows["t_start"] < hi)
                    & (rows["ok"] == True)]  # noqa: E712
        st = summary["steps"][int(s["index"])]
        assert st["qps"] == pytest.approx(len(mine) / (hi - lo), rel=REL)
        assert st["p99_ms"] == pytest.approx(float(np.percentile(mine["latency_ms"], 99)), rel=REL)


@pytest.fixture
def knee_target():
    proc, url = start_target(["--mode", "knee", "--slots", str(SLOTS), "--service-ms", str(SERVICE_MS)])
    yield proc, url
    stop_target(proc)


# -- the figures of a run directory (no process) --------------------------------------------------
def test_live_figures_of_a_finished_run_equal_its_summary(tmp_path):
    """A synthetic run (tests/synthetic_run.py, failures in one step) analysed by the real
    analysis: every step final, its figures the summary's, and the summary's against numpy."""
    import numpy as np

    from kneeswarm.analysis.measure.live import LiveRun
    from kneeswarm.launch.lifecycle import analyze_run
    from tests.synthetic_run import closed_loop, make_run, steady_rows

    rd = make_run(tmp_path, closed_loop(4), users=(1, 2, 4, 8, 16), error_plan={1: {"http_5xx": 30}})
    summary, error = analyze_run(rd)
    assert error is None
    fig = LiveRun(rd).figures()
    assert fig.done and [s.index for s in fig.steps] == [0, 1, 2, 3, 4] and fig.current.users == 16
    for s, st in zip(fig.steps, summary["steps"]):
        assert s.final and s.users == st["users"] and s.requests == st["requests"]
        assert s.qps == pytest.approx(st["qps"], rel=REL) and s.p99_ms == pytest.approx(st["p99_ms"], rel=REL)
        rows = steady_rows(rd, s.index)
        ok = rows[rows["ok"] == True]  # noqa: E712
        assert s.p99_ms == pytest.approx(float(np.percentile(ok["latency_ms"], 99)), rel=REL)
    assert summary["steps"][1]["errors"] == {"http_5xx": 30}
    vm = [h for h in fig.hosts if h.table == "vmstat"]
    assert {h.column: h.value for h in vm}["cs"] == 16000.0 and {h.host for h in vm} == {"server-1"}
    assert [h.id for h in fig.hosts if h.table == "process"][0] == "4242"
    assert [f["id"] for f in fig.findings] == [f["id"] for f in summary["findings"]] != []
    assert fig.knee["knee"]["users"] == summary["knee"]["users"] == 4


def test_live_figures_while_a_step_runs_and_rows_that_come_late(tmp_path):
    """The last step without t_end is live (not final, up to now - LAG_S); once final, rows that
    arrive for it are counted late, never mixed in."""
    from kneeswarm.analysis.measure.live import LAG_S, LiveRun
    from tests.synthetic_run import closed_loop, make_run

    rd = make_run(tmp_path, closed_loop(4), users=(1, 2), last_t_end=False)
    steps = rd.read_steps()
    t_ramp1 = float(steps["t_ramp"].iloc[1])
    live = LiveRun(rd)
    now = t_ramp1 + 10.0
    fig = live.figures(now=now)
    assert not fig.done and fig.steps[0].final and not fig.steps[1].final
    assert fig.steps[1].window_s == pytest.approx(now - LAG_S - (float(steps["t_steady"].iloc[1]) + 2.0))
    rd.write_steps([[*r[:4], r[2] + 14.0 if i == 1 else r[4]] for i, r in enumerate(steps.itertuples(index=False))])
    assert live.figures(now=t_ramp1 + 14.0 + LAG_S).steps[1].final
    rd.write_request_part({"t_start": [t_ramp1 + 5.0] * 3, "latency_ms": [1.0] * 3, "ok": [True] * 3, "step": [1] * 3},
                          seq=9)
    fig = live.figures(now=t_ramp1 + 30.0)
    assert fig.late_rows == 3 and fig.steps[1].final


def test_an_open_loop_step_says_its_rate(tmp_path):
    """Open loop: each step's arrivals/s is its users (arrival sources) x source_rate, from plan.toml."""
    import tomllib

    import tomli_w

    from kneeswarm.analysis.measure.live import LiveRun
    from kneeswarm.launch.export import series as export_series
    from tests.synthetic_run import closed_loop, make_run

    rd = make_run(tmp_path, closed_loop(4), users=(2, 4))
    plan = tomllib.loads(rd.plan_path.read_text())
    plan["load"].update(arrivals="open", source_rate=2.5)
    rd.plan_path.write_text(tomli_w.dumps(plan))
    fig = LiveRun(rd).figures()
    assert [s.rate for s in fig.steps] == [5.0, 10.0]
    assert [v for n, _, v in export_series(fig) if n == "step_rate"] == [10.0]
    closed = LiveRun(make_run(tmp_path / "closed", closed_loop(4), users=(2, 4))).figures()
    assert [s.rate for s in closed.steps] == [None, None]
    assert not [n for n, _, _ in export_series(closed) if n == "step_rate"]


def test_prometheus_endpoint_serves_the_figures(tmp_path):
    """The endpoint itself (prometheus_client's server on loopback, port 0), scraped over HTTP."""
    from kneeswarm.launch.export import Exporter, serve_prometheus
    from kneeswarm.launch.lifecycle import analyze_run
    from tests.synthetic_run import closed_loop, make_run

    rd = make_run(tmp_path, closed_loop(4), users=(1, 4))
    summary, _ = analyze_run(rd)
    server = serve_prometheus("127.0.0.1:0", Exporter(lambda: rd))
    try:
        scrape = parse_exposition(requests.get(f"http://127.0.0.1:{server.server_port}/metrics", timeout=5).text)
    finally:
        server.shutdown()
        server.server_close()
    for i, st in enumerate(summary["steps"]):
        assert_step_figures_match(scrape, st, i)
    assert max(series(scrape, "kneeswarm_step").values()) == 1 and max(series(scrape, "kneeswarm_run_done").values()) == 1
    assert all(f'run_id="{rd.path.name}"' in k for k in series(scrape, "kneeswarm_step_qps"))


def test_a_failed_push_is_said_not_raised(tmp_path, monkeypatch):
    """The conductor's OTLP push to a receiver that is not there: one line back (the conductor
    prints it and keeps it in meta.json's warnings), the run's results untouched."""
    import socket

    from kneeswarm.launch.export import ExportOptions
    from tests.synthetic_run import closed_loop, make_run

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{closed}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    rd = make_run(tmp_path, closed_loop(4), users=(1, 2))
    assert ExportOptions(otel=True).after_run(rd) == ["OpenTelemetry: the OTLP export of the final figures failed"]
    received = OtlpReceiver()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", received.url)
        assert ExportOptions(otel=True).after_run(rd) == []
    finally:
        received.close()
    steps = [p for p in received.points() if p["name"] == "kneeswarm.step.users"]
    assert [(p["service"], p["value"]) for p in steps] == [("kneeswarm", 2.0)]


@pytest.mark.parametrize("text,want", [("9646", ("127.0.0.1", 9646)), ("0.0.0.0:9646", ("0.0.0.0", 9646)),
                                       ("[::1]:9646", ("::1", 9646)), ("localhost:0", ("localhost", 0))])
def test_an_address_without_a_host_is_loopback(text, want):
    from kneeswarm.launch.export import parse_address

    assert parse_address(text) == want


@pytest.mark.parametrize("text", ["abc", "host:", ":9646", "70000", "h:p"])
def test_a_bad_address_is_one_line(text):
    from kneeswarm.launch.export import ExportError, parse_address

    with pytest.raises(ExportError, match="^--kneeswarm-prometheus: want PORT or HOST:PORT"):
        parse_address(text)


@pytest.mark.parametrize("command", ["run", "demo"])
def test_run_and_demo_pass_the_export_to_locust(command):
    """`kneeswarm run` and `demo` take the same flags into the same Conductor (the real run above
    is `run`'s): --otel to the master and the local workers, the endpoint to the master only."""
    from kneeswarm.launch.cli import _export, build_parser

    args = build_parser().parse_args([command, "--otel", "--prometheus", "0", "--prometheus-linger", "5"])
    export = _export(args)
    assert (export.otel, export.prometheus, export.linger) == (True, "0", 5.0)
    assert export.master_args() == ["--otel", "--kneeswarm-prometheus", "0"] and export.worker_args() == ["--otel"]
    plain = _export(build_parser().parse_args([command]))
    assert plain.master_args() == plain.worker_args() == []


def test_kneeswarm_run_with_a_bad_address_is_exit_2_and_no_run_dir(tmp_path):
    res = run_cli("run", "--target", "http://127.0.0.1:9", "--prometheus", "here", "--out", str(tmp_path))
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        "kneeswarm: error: --prometheus: want PORT or HOST:PORT, got 'here'"]
    assert not any(tmp_path.iterdir())


def test_kneeswarm_run_with_a_taken_port_is_exit_2_and_no_run_dir(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = run_cli("run", "--target", "http://127.0.0.1:9", "--prometheus", str(port), "--out", str(tmp_path))
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        f"kneeswarm: error: --prometheus {port}: cannot listen on 127.0.0.1:{port}: Address already in use"]
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_plain_locust_with_a_taken_port_is_exit_2_and_no_run_dir(tmp_path, knee_target):
    import socket

    _, url = knee_target
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        res = subprocess.run([sys.executable, "-m", "locust", "-f", "locustfiles/swarm.py", "--headless", "--host", url,
                              "--kneeswarm-out", str(tmp_path), "--kneeswarm-prometheus", str(taken.getsockname()[1])],
                             capture_output=True, text=True, timeout=60, cwd=REPO)
    assert res.returncode == 2, res.stderr[-2000:]
    said = [line for line in res.stderr.splitlines() if "kneeswarm:" in line]
    assert len(said) == 1 and "cannot listen on 127.0.0.1:" in said[0], res.stderr[-2000:]
    assert not any(tmp_path.iterdir())


def run_exporting(command: Callable[[int], list[str]], timeout: float) -> tuple[subprocess.CompletedProcess,
                                                                              Scraper, OtlpReceiver]:
    """Run ``command(port)`` (a load run serving its Prometheus endpoint on that port) with Locust's
    OTLP export going to a local receiver every second, and the endpoint scraped meanwhile:
    (its result, the scraper, the receiver), both stopped once it ended."""
    otlp, port = OtlpReceiver(), free_port()
    scraper = Scraper(f"http://127.0.0.1:{port}/metrics")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
           "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url, "OTEL_METRIC_EXPORT_INTERVAL": "1000",
           "OTEL_TRACES_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none"}
    try:
        res = subprocess.run(command(port), capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)
    finally:
        scraper.stop()
        otlp.close()
    return res, scraper, otlp


# -- plain locust: the master writes the report itself -----------------------------------------------
@pytest.mark.long
@pytest.mark.slow
def test_plain_locust_exports_the_final_figures_and_findings(tmp_path, knee_target):
    """`locust -f locustfiles/swarm.py --headless --otel --kneeswarm-prometheus PORT`: the master
    writes the report, so its endpoint (during --kneeswarm-prometheus-linger) and its last OTLP
    export carry every step's final figures and the findings."""
    _, url = knee_target
    res, scraper, otlp = run_exporting(lambda port: [
        sys.executable, "-m", "locust", "-f", "locustfiles/swarm.py", "--headless", "--host", url,
        "--kneeswarm-steps", "2,8", "--kneeswarm-hold", "5", "--kneeswarm-ramp", "1", "--kneeswarm-settle", "1",
        "--kneeswarm-out", str(tmp_path), "--otel", "--kneeswarm-prometheus", str(port),
        "--kneeswarm-prometheus-linger", "4", "--only-summary"], timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    run_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
    summary = read_summary(run_dir)
    check_rows_truth(summary, run_dir)
    done = [s for _, s in scraper.scrapes if series(s, "kneeswarm_run_done") and max(series(s, "kneeswarm_run_done").values())]
    assert done, len(scraper.scrapes)
    for i, st in enumerate(summary["steps"]):
        assert_step_figures_match(done[-1], st, i)
    want = sorted(f["id"] for f in summary.get("findings") or [])
    assert sorted(k.split('id="')[1].split('"')[0] for k in series(done[-1], "kneeswarm_finding")) == want
    points = otlp.points()
    last_t = max(p["t"] for p in points if p["name"] == "kneeswarm.run.done")
    last = [p for p in points if p["t"] == last_t]
    assert [p["value"] for p in last if p["name"] == "kneeswarm.run.done"] == [1.0]
    for i, st in enumerate(summary["steps"]):
        got = [p["value"] for p in last if p["name"] == "kneeswarm.step.p99_ms" and p["attrs"]["step"] == str(i)]
        assert got == [pytest.approx(st["p99_ms"], rel=REL)]
    assert sorted(p["attrs"]["id"] for p in last if p["name"] == "kneeswarm.finding") == want


# -- kneeswarm run: --otel and --prometheus passed through -----------------------------------------
@pytest.mark.long
@pytest.mark.slow
def test_kneeswarm_run_exports_over_otlp_and_prometheus(tmp_path, knee_target):
    """`kneeswarm run --otel --prometheus PORT`: Locust's own instruments and kneeswarm's reach an
    OTLP receiver; the master's endpoint, scraped during the run, shows the current step and each
    finished step's figures equal to summary.json's; after the analysis the conductor serves (and
    pushes) the final figures of every step and the findings.  Each step is held 9 s: a step's
    figures are final 6 s (LAG_S) after it ended, so the next one still runs ~4 s with them final,
    less the snapshot's age (<= 2 s), for a scrape every 0.5 s and an OTLP export every 1 s."""
    proc, url = knee_target
    res, scraper, otlp = run_exporting(lambda port: [
        KNEESWARM, "run", "--target", url, "--steps", "2,4,8", "--hold", "9", "--ramp", "1", "--settle", "1",
        "--workers", "2", "--pid", str(proc.pid), "--metrics-url", url + "/metrics", "--out", str(tmp_path),
        "--name", "export", "-q", "--otel", "--prometheus", str(port), "--prometheus-linger", "4"], timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "export:" not in res.stderr, res.stderr
    run_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
    summary = read_summary(run_dir)
    steps = summary["steps"]
    check_rows_truth(summary, run_dir)
    check_prometheus_during_and_after(scraper.scrapes, summary, run_dir)
    check_otlp(otlp.points(), summary, run_dir)


def check_prometheus_during_and_after(scrapes: list, summary: dict, run_dir: Path) -> None:
    steps = summary["steps"]
    live = [s for _, s in scrapes if series(s, "kneeswarm_run_done") and max(series(s, "kneeswarm_run_done").values()) == 0]
    done = [s for _, s in scrapes if series(s, "kneeswarm_run_done") and max(series(s, "kneeswarm_run_done").values()) == 1]
    assert live and done, (len(live), len(done))
    # during the run: the current step with its users, in the order run, and a finished step's
    # figures final while the next one was going on
    seen = [(int(max(series(s, "kneeswarm_step").values())), max(series(s, "kneeswarm_step_users").values()))
            for s in live if series(s, "kneeswarm_step")]
    assert sorted(set(seen)) == [(i, st["users"]) for i, st in enumerate(steps)], sorted(set(seen))
    for i, st in enumerate(steps[:-1]):
        during = [s for s in live if max(series(s, "kneeswarm_step").values()) > i
                  and step_value(s, "kneeswarm_step_final", i) == 1.0]
        assert during, f"step {i} was never final while the run went on"
        assert_step_figures_match(during[-1], st, i)
    assert any(k.startswith('{column="us",host="local"') for s in live for k in series(s, "kneeswarm_host_sample"))
    # after the analysis: every step, the findings, the knee; the host samples as the CSVs end
    last = done[-1]
    for i, st in enumerate(steps):
        assert_step_figures_match(last, st, i)
    assert sorted(k.split('id="')[1].split('"')[0] for k in series(last, "kneeswarm_finding")) == \
        sorted(f["id"] for f in summary.get("findings") or [])
    peak = series(last, "kneeswarm_knee_users")
    assert [v for k, v in peak.items() if 'kind="peak"' in k] == [summary["peak"]["users"]]
    import pandas as pd

    vm = pd.read_csv(run_dir / "hosts" / "local" / "vmstat.csv").iloc[-1]
    host = series(last, "kneeswarm_host_sample")
    assert [v for k, v in host.items() if '{column="cs",host="local"' in k and 'table="vmstat"' in k] == [vm["cs"]]


def check_otlp(points: list[dict], summary: dict, run_dir: Path) -> None:
    steps = summary["steps"]
    # Locust's own: every request of every worker in locust.client.duration (each process's last
    # cumulative count), the users gauge up to the last step's
    durations: dict[tuple, int] = {}
    for p in points:
        if p["name"] == "locust.client.duration":
            key = (p["start"], tuple(sorted(p["attrs"].items())))
            durations[key] = max(durations.get(key, 0), p["value"])
    assert sum(durations.values()) == request_rows(run_dir)
    users = [p["value"] for p in points if p["name"] == "locust.users.count"]
    assert users and max(users) == steps[-1]["users"]
    # kneeswarm's, from the master during the run (service "locust") and pushed by the conductor
    # after the analysis (service "kneeswarm")
    master = [p for p in points if p["service"] == "locust" and p["name"].startswith("kneeswarm.")]
    assert {p["value"] for p in master if p["name"] == "kneeswarm.step.users"} == {st["users"] for st in steps}
    final = [p for p in points if p["service"] == "kneeswarm"]
    for i, st in enumerate(steps):
        for name, key in (("kneeswarm.step.qps", "qps"), ("kneeswarm.step.p99_ms", "p99_ms")):
            got = [p["value"] for p in final if p["name"] == name and p["attrs"]["step"] == str(i)]
            assert got == [pytest.approx(st[key], rel=REL)], (name, i, got, st[key])
        early = [p["value"] for p in master if p["name"] == "kneeswarm.step.qps" and p["attrs"]["step"] == str(i)
                 and any(q["name"] == "kneeswarm.step.final" and q["attrs"]["step"] == str(i) and q["value"] == 1
                         and q["t"] == p["t"] for q in master)]
        if i < len(steps) - 1:
            assert early and early[-1] == pytest.approx(st["qps"], rel=REL)
    assert sorted(p["attrs"]["id"] for p in final if p["name"] == "kneeswarm.finding") == \
        sorted(f["id"] for f in summary.get("findings") or [])


# -- the Grafana dashboard -----------------------------------------------------------------------
DASHBOARD = REPO / "compose" / "grafana" / "kneeswarm.json"
# Grafana's classic dashboard JSON model, grafana/grafana kinds/dashboard/dashboard_kind.cue (schema
# 0.0, commit 00139e84396be1600192135b87b8607f3f7b79d0): the fields it declares without `?`.  Those
# with a default are written out anyway (an import fills them, a provisioned file is read as is).
DASHBOARD_KEYS = {"style", "editable", "graphTooltip", "schemaVersion"}
PANEL_KEYS = {"type", "transparent", "repeatDirection", "transformations", "options", "fieldConfig"}
ROW_KEYS = {"type", "collapsed", "id", "panels"}
ANNOTATION_KEYS = {"name", "datasource", "enable", "iconColor"}
VARIABLE_KEYS = {"type", "name", "hide"}  # the schema's #VariableModel also lists `state`: runtime, not saved


def test_the_grafana_dashboard_has_the_json_models_required_keys():
    dash = json.loads(DASHBOARD.read_text())
    assert DASHBOARD_KEYS <= dash.keys() and dash["graphTooltip"] in (0, 1, 2) and isinstance(dash["schemaVersion"], int)
    assert dash["style"] in ("light", "dark") and isinstance(dash["editable"], bool)
    ids, cells = set(), set()
    for p in dash["panels"]:
        assert (ROW_KEYS if p["type"] == "row" else PANEL_KEYS) <= p.keys(), (p.get("title"), p.keys())
        assert p["type"] and p["id"] not in ids
        ids.add(p["id"])
        g = p["gridPos"]
        assert g["h"] > 0 and 0 < g["w"] <= 24 and 0 <= g["x"] < 24 and g["x"] + g["w"] <= 24 and g["y"] >= 0
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine
        if p["type"] != "row":
            assert {"defaults", "overrides"} <= p["fieldConfig"].keys()
            assert all({"expr", "refId"} <= t.keys() for t in p["targets"])
    assert all(ANNOTATION_KEYS <= a.keys() for a in dash["annotations"]["list"])
    assert all(VARIABLE_KEYS <= v.keys() for v in dash["templating"]["list"])


def test_the_grafana_dashboard_reads_what_the_endpoint_serves():
    """Every metric and label a panel or an annotation asks for is one kneeswarm/launch/export.py serves,
    and each family of the endpoint has a panel (client load, server signals, knee, findings)."""
    import re

    from kneeswarm.launch.export import METRICS

    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in dash["annotations"]["list"]]
    used = set()
    for e in exprs:
        for name, labels in re.findall(r"(kneeswarm_\w+)\{([^}]*)\}", e):
            assert name.removeprefix("kneeswarm_") in METRICS, name
            used.add(name.removeprefix("kneeswarm_"))
            allowed = {"run_id", *METRICS[name.removeprefix("kneeswarm_")][0]}
            assert {m for m in re.findall(r"(\w+)\s*=~?", labels)} <= allowed, e
    assert {"step_users", "step_qps", "step_p99_ms", "host_sample", "knee_users", "finding", "step"} <= used

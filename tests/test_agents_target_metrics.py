"""The target's own metrics, scraped from the load side (kneeswarm.collectors.prometheus.PrometheusScraper),
and the agent no longer scraping them by default.

A real demo target serves real requests while the scraper runs at 1 Hz; a dead URL is counted,
never fatal.
"""

from __future__ import annotations

import json
import threading
import time

import pandas as pd
import pytest
import requests

from kneeswarm.agents import AgentSettings, selection
from kneeswarm.collectors.prometheus import PrometheusScraper, write_prometheus_csv
from conftest import wait_for

SERVED = 'kneeswarm_target_requests_total{code="200"}'


def _infer(url: str, stop: threading.Event) -> None:
    body = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [0.0, 1.0, 2.0, 3.0]}]}
    with requests.Session() as s:
        while not stop.is_set():
            try:
                s.post(f"{url}/v2/models/demo/infer", json=body, timeout=5)
            except requests.RequestException:
                time.sleep(0.05)


def test_scraper_on_a_real_target_sees_requests_rising(start_demo_target, tmp_path):
    target = start_demo_target("--mode", "knee", "--slots", "4", "--service-ms", "20")
    stop = threading.Event()
    loaders = [threading.Thread(target=_infer, args=(target.url, stop), daemon=True) for _ in range(2)]
    for t in loaders:
        t.start()
    raw = tmp_path / "hosts" / "target" / "raw" / "prometheus.jsonl"
    scraper = PrometheusScraper(target.url + "/metrics", raw)
    before = time.time()
    scraper.start()
    try:
        # flushed line by line: readable during the run (three 1 Hz scrapes, or the deadline)
        wait_for(lambda: raw.is_file() and len(raw.read_text().splitlines()) >= 3, 10, "three scrapes in the raw file")
    finally:
        stats = scraper.stop()
        stop.set()
        for t in loaders:
            t.join(timeout=10)
    after = time.time()
    assert stats["failed"] == 0 and stats["ok"] == stats["scrapes"] >= 3, stats
    recs = [json.loads(line) for line in raw.read_text().splitlines()]
    assert all(r["url"] == target.url + "/metrics" and "text" in r for r in recs)
    ts = [r["t"] for r in recs]
    assert before <= ts[0] and ts[-1] <= after  # this machine's (the master's) clock
    assert all(0.7 <= b - a <= 1.5 for a, b in zip(ts, ts[1:])), ts  # 1 Hz

    info = write_prometheus_csv(raw, tmp_path / "hosts" / "target" / "prometheus.csv")
    df = pd.read_csv(tmp_path / "hosts" / "target" / "prometheus.csv")
    assert info["rows"] == len(df) == len(recs) and info["skipped"] == 0
    assert df.columns[0] == "t" and SERVED in df.columns and "kneeswarm_target_inflight" in df.columns
    served = df[SERVED].to_numpy()
    assert (served[1:] >= served[:-1]).all() and served[-1] > served[0] + 10, served


def test_scrape_failures_are_counted_never_fatal(tmp_path):
    from kneeswarm.launch.conductor import free_port

    raw = tmp_path / "prometheus.jsonl"
    scraper = PrometheusScraper(f"http://127.0.0.1:{free_port()}/metrics", raw, interval=0.3)
    scraper.start()
    wait_for(lambda: scraper.scrapes >= 3, 10, "three scrapes")
    stats = scraper.stop()
    assert not scraper.is_alive()
    assert stats["scrapes"] >= 3 and stats["failed"] == stats["scrapes"] and stats["ok"] == 0
    assert stats["last_error"] == "connection refused"
    info = write_prometheus_csv(raw, tmp_path / "prometheus.csv")
    assert info["rows"] == 0 and info["skipped"] == stats["scrapes"]
    assert list(pd.read_csv(tmp_path / "prometheus.csv").columns) == ["t"]


def test_a_slow_target_is_cut_at_the_timeout(tmp_path):
    """A /metrics that never answers holds the scraper no longer than its timeout."""
    import socket

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)  # accepts connections (kernel backlog), never answers
    try:
        scraper = PrometheusScraper(f"http://127.0.0.1:{srv.getsockname()[1]}/metrics", tmp_path / "p.jsonl",
                                    interval=1.0, timeout=0.3)
        started = time.monotonic()
        rec = scraper.scrape_once()
        assert time.monotonic() - started < 2.0
        assert "timed out" in rec["error"]
    finally:
        srv.close()


def test_agent_does_not_scrape_the_target_unless_a_host_lists_it():
    facts = {"tools": {}, "procfs": True}
    url = AgentSettings(metrics_url="http://127.0.0.1:1/metrics")
    sel = selection.select(facts, None, 123, url, "local")
    assert "prometheus" not in sel.enabled and not any(s.name == "prometheus" for s in sel.specs)
    sel = selection.select(facts, ["prometheus"], 123, url, "local")
    assert [(s.name, s.sampler, s.params) for s in sel.specs] == [("prometheus", "prometheus", {"url": url.metrics_url})]
    sel = selection.select(facts, ["prometheus"], 123, AgentSettings(), "local")
    assert sel.skipped == {"prometheus": "no metrics_url"}


@pytest.mark.slow
def test_run_writes_target_metrics_on_the_master_clock(start_demo_target, tmp_path):
    """A whole `kneeswarm run` with --metrics-url: hosts/target/ holds the raw scrapes and the CSV."""
    from kneeswarm.contracts.rundir import RunDir

    from conftest import run_cli

    target = start_demo_target("--mode", "knee", "--slots", "4", "--service-ms", "20")
    res = run_cli("run", "--target", target.url, "--steps", "1,2", "--hold", "3", "--ramp", "1", "--settle", "0",
                  "--workers", "1", "--pid", str(target.pid), "--metrics-url", target.url + "/metrics",
                  "--out", str(tmp_path), "-q", timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    run = RunDir(next(p for p in tmp_path.iterdir() if p.is_dir()))
    meta = run.read_meta()
    tm = meta["target_metrics"]
    assert tm["host"] == "target" and tm["ok"] >= 6 and tm["failed"] == 0, tm
    df = run.read_host_csv("target", "prometheus")
    steps = run.read_steps()
    assert df["t"].min() <= steps["t_ramp"].min() and df["t"].max() >= steps["t_end"].max() - 1.5
    served = df[SERVED].to_numpy()
    assert served[-1] > served[0]
    assert not (run.raw_dir("local") / "prometheus.jsonl").exists()  # not the agent's job any more
    assert "prometheus" not in meta["hosts"]["local"]["collectors"]


def test_the_host_and_the_load_side_scrape_alike(tmp_path):
    """One scraper (agents/remote/prometheus.py) behind both: the agent's sampler on a host and the
    load side's PrometheusScraper give the same record for the same answers -- the text, an HTTP
    error, and an answer over the size cap (a failed scrape in both, never a cut one)."""
    import http.server

    from kneeswarm.agents.remote import PrometheusSampler
    from kneeswarm.agents.remote.defaults import PROMETHEUS_MAX_BYTES

    bodies = {"/metrics": b"up 1\n", "/big": b"x" * (PROMETHEUS_MAX_BYTES + 1)}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            body = bodies.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        for path, want in (("/metrics", {"text": "up 1\n"}), ("/nope", {"error": "HTTP 404"}),
                           ("/big", {"error": f"answer larger than {PROMETHEUS_MAX_BYTES} bytes"})):
            url = f"http://127.0.0.1:{srv.server_address[1]}{path}"
            load_side = PrometheusScraper(url, tmp_path / "p.jsonl", timeout=5.0).scrape_once()
            host = PrometheusSampler("prometheus", str(tmp_path / "h.jsonl"), 10.0, threading.Event(), url=url)
            host_rec = host.sample(time.time())[0]
            for rec in (load_side, host_rec):
                assert {k: v for k, v in rec.items() if k in ("text", "error")} == want and rec["url"] == url, rec
    finally:
        srv.shutdown()
        srv.server_close()

"""OpenAI streaming measured right, against the real demo target in its own process.

The target releases the first text token D ms after a request arrives and each later one G ms
after the one before (kneeswarm/target/llm.py); a real Locust process (local runner, kneeswarm's
own locustfile plus tests/locust_probe.py) streams from it. TTFT comes from the request rows the
recorder wrote, ITL from every gap the user measured; medians by numpy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kneeswarm.contracts.rundir import RunDir

from conftest import REPO

pytestmark = pytest.mark.slow

D_MS, G_MS, MAX_TOKENS = 50.0, 25.0, 8
TINY_MODEL = ["--work", "1", "--hidden", "64", "--tokens", "1", "--request-threads", "2"]
LOCUST_TIMEOUT = 120


def run_probe(tmp_path: Path, target_url: str, plan_body: str, users: int, hold: float = 5.0,
              env: dict | None = None) -> tuple[Path, dict, subprocess.CompletedProcess]:
    """One real Locust process (local runner) running kneeswarm's user with ``users`` users."""
    out = tmp_path / f"runs-{users}"
    plan = tmp_path / f"plan-{users}.toml"
    plan.write_text(f'name = "stream"\ntarget = "{target_url}"\nprotocol = "openai"\n'
                    f"[load]\nsteps = [{users}]\nramp = 0.5\nhold = {hold}\nsettle = 0.5\n" + plan_body)
    probe = tmp_path / f"probe-{users}.json"
    res = subprocess.run(
        [sys.executable, "-m", "locust", "-f", str(REPO / "tests" / "locust_probe.py"), "--headless",
         "--kneeswarm-plan", str(plan), "--kneeswarm-out", str(out), "--loglevel", "WARNING"],
        capture_output=True, text=True, timeout=LOCUST_TIMEOUT, cwd=REPO,
        env={**os.environ, "KNEESWARM_PROBE_OUT": str(probe), **(env or {})},
    )
    runs = [p for p in out.iterdir() if p.is_dir()]
    assert len(runs) == 1, (runs, res.stderr[-2000:])
    return runs[0], json.loads(probe.read_text()), res


def server_ttft(url: str) -> tuple[float, float]:
    """The target's own TTFT so far (its /metrics: arrival to first token, on its clock): (sum s, count)."""
    import requests

    from kneeswarm.collectors.prometheus import parse_exposition

    m = parse_exposition(requests.get(url + "/metrics", timeout=5).text)
    return m["vllm:time_to_first_token_seconds_sum"], m["vllm:time_to_first_token_seconds_count"]


@pytest.fixture(scope="module")
def llm_target():
    from kneeswarm.launch.cli import start_target, stop_target

    proc, url = start_target([*TINY_MODEL, "--ttft-ms", str(D_MS), "--itl-ms", str(G_MS)])
    yield url
    stop_target(proc)


@pytest.mark.parametrize("users", [1, 16])
def test_ttft_and_itl_medians_match_the_targets_schedule(tmp_path, llm_target, users):
    before = server_ttft(llm_target)
    run_dir, probe, res = run_probe(tmp_path, llm_target, f"[request]\nmax_tokens = {MAX_TOKENS}\n", users)
    after = server_ttft(llm_target)
    # the server's TTFT is D plus however late its event loop woke (more with 16 streams on a busy
    # machine); the client adds only the way in and out (loopback, under 5 ms) and never sees the
    # first token before D (less the target's TIMER_SLACK_S, 0.5 ms)
    late_ms = 1000 * (after[0] - before[0]) / (after[1] - before[1]) - D_MS
    rows = RunDir(run_dir).read_requests()
    assert len(rows) >= 10, res.stderr[-2000:]
    assert rows["ok"].all(), rows["error"].value_counts()
    ttft = rows["ttft_ms"].to_numpy(dtype=float)
    itl = np.concatenate([np.asarray(g, dtype=float) for g in probe["itl_ms"]])
    ttft_median, itl_median = float(np.median(ttft)), float(np.median(itl))
    print(f"{users} users: {len(rows)} requests, TTFT median {ttft_median:.2f} ms (D={D_MS}, server mean "
          f"{D_MS + late_ms:.2f}), ITL median {itl_median:.2f} ms over {len(itl)} gaps (G={G_MS})")
    assert D_MS - 0.5 <= ttft_median <= D_MS + late_ms + 5.0, (ttft_median, late_ms)
    assert abs(itl_median - G_MS) <= 3.0
    # Every request: the server's usage says MAX_TOKENS, the client saw as many text chunks.
    assert set(rows["tokens_out"]) == {MAX_TOKENS}
    assert set(probe["chunks"]) == {MAX_TOKENS} and not any(probe["counted"])
    assert all(len(g) == MAX_TOKENS - 1 for g in probe["itl_ms"])
    # The whole stream is the request's latency: the last token leaves at D + (n - 1) G.
    assert (rows["latency_ms"] >= D_MS + (MAX_TOKENS - 1) * G_MS - 0.5).all()


def test_tokens_are_counted_and_flagged_when_the_server_sends_no_usage(tmp_path, llm_target):
    run_dir, probe, _ = run_probe(tmp_path, llm_target, "[request]\nmax_tokens = 5\ninclude_usage = false\n"
                                  "endpoint = \"completions\"\nprompt_tokens = 7\n", 2, hold=2.0)
    rows = RunDir(run_dir).read_requests()
    assert len(rows) >= 4 and rows["ok"].all()
    assert set(rows["tokens_out"]) == {5} and set(rows["tokens_in"]) == {7}
    assert all(probe["counted"]) and set(probe["usage_out"]) == {None}


def test_a_server_that_ignores_stream_true_is_judged_as_a_whole_answer(tmp_path):
    """Some servers answer a streamed request in one JSON piece: counted ok, tokens from usage, no TTFT."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    answer = json.dumps({"choices": [{"message": {"role": "assistant", "content": "a b c"}, "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 9, "completion_tokens": 3}}).encode()

    class Whole(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):  # noqa: N802 - http.server's naming
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Whole)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        run_dir, probe, _ = run_probe(tmp_path, f"http://127.0.0.1:{server.server_port}", "", 1, hold=1.5)
    finally:
        server.shutdown()
    rows = RunDir(run_dir).read_requests()
    assert len(rows) >= 5 and rows["ok"].all()
    assert set(rows["tokens_out"]) == {3} and set(rows["tokens_in"]) == {9} and rows["ttft_ms"].isna().all()
    assert probe["chunks"] == []  # no stream was read

"""Connection shapes of real servers, reproduced by a small real server of the standard library
(the servers themselves run in tests_conformance/, `make conformance`).

llama.cpp's llama-server (seen in the conformance suite): after every streamed answer it closes
the connection (a clean FIN, no "Connection: close" header: the headers went out long before), and
it writes each token's chunk with Nagle's algorithm on.  A user's next request sent in the moment
before the FIN arrives found the socket closed ("connection closed.", 16 % of requests at one user);
and a reader that delays its ACKs got a whole answer in one arrival.  This server does the same:
SSE chunks TOKEN_MS apart, each its own small write with Nagle on, then a clean close.  (The
bunching does not reproduce here -- a Python server's gaps of a few ms on loopback are ACKed in
time -- so the reader's TCP_QUICKACK is checked by the conformance suite against llama-server;
this test fails without the resend of users.STALE_CONNECTION_RETRIES.)
"""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from kneeswarm.rundir import RunDir

from conftest import run_cli

pytestmark = pytest.mark.slow

TOKENS, TOKEN_MS = 12, 4.0


class ClosingSSEServer:
    """HTTP/1.1 on loopback: GET /health and /v1/models; POST /v1/chat/completions streams TOKENS
    chunks TOKEN_MS apart and closes the connection after the last one.  Counts the POSTs it read."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.posts = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        f = conn.makefile("rb")
        try:
            while True:  # keep-alive: requests until this server decides to close
                line = f.readline()
                if not line:
                    return
                method, path, _ = line.decode().split(" ", 2)
                length = 0
                while (h := f.readline()) not in (b"\r\n", b""):
                    if h.lower().startswith(b"content-length:"):
                        length = int(h.split(b":")[1])
                f.read(length)
                if method == "GET":
                    body = json.dumps({"data": [{"id": "demo"}]} if path == "/v1/models" else {"status": "ok"}).encode()
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                                 + str(len(body)).encode() + b"\r\n\r\n" + body)
                    continue
                with self._lock:
                    self.posts += 1
                self._stream(conn)
                conn.shutdown(socket.SHUT_WR)  # as llama-server: the connection ends with the answer (FIN)
                conn.settimeout(1.0)
                while conn.recv(65536):  # a request that crossed the FIN is read, never answered
                    pass
                return
        except OSError:
            return
        finally:
            conn.close()

    @staticmethod
    def _stream(conn: socket.socket) -> None:
        def chunk(doc: dict | str) -> None:
            data = b"data: " + (doc if isinstance(doc, str) else json.dumps(doc)).encode() + b"\n\n"
            conn.sendall(f"{len(data):x}\r\n".encode() + data + b"\r\n")  # one small write (Nagle on)

        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
        for i in range(TOKENS):
            time.sleep(TOKEN_MS / 1000.0)
            chunk({"choices": [{"index": 0, "delta": {"content": f"t{i} "}}]})
        chunk({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        chunk({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": TOKENS}})
        chunk("[DONE]")
        conn.sendall(b"0\r\n\r\n")

    def close(self) -> None:
        self.sock.close()


def test_a_server_that_closes_after_each_stream_costs_no_request(tmp_path):
    server = ClosingSSEServer()
    try:
        plan = tmp_path / "plan.toml"
        plan.write_text(f'target = "{server.url}"\nprotocol = "openai"\nname = "closing"\n'
                        '[load]\nsteps = [1, 2]\nramp = 0.5\nhold = 3.0\nsettle = 0.5\nworkers = 1\n'
                        '[request]\nmax_tokens = 12\n[analysis]\nmin_requests = 10\n')
        res = run_cli("run", str(plan), "--out", str(tmp_path / "runs"), timeout=120)
        posts = server.posts
    finally:
        server.close()
    assert res.returncode == 0, res.stderr[-2000:]
    run_dir = next((tmp_path / "runs").iterdir())
    rows = RunDir(run_dir).read_requests()
    assert len(rows) > 50 and rows["ok"].all(), rows["error"].value_counts()
    # every POST the server read is a row (but those in flight at the stop): none sent twice
    assert 0 <= posts - len(rows) <= 2, (posts, len(rows))
    # the chunks left TOKEN_MS apart, and the reader saw them so: its TPOT is the server's gap
    tpot = (rows["latency_ms"] - rows["ttft_ms"]) / (rows["usage_out"] - 1)
    assert np.median(tpot) == pytest.approx(TOKEN_MS, rel=0.25), tpot.describe()
    assert (rows["ttft_ms"] < rows["latency_ms"] / 2).mean() > 0.9, rows[["ttft_ms", "latency_ms"]].describe()

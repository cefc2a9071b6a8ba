"""The demo target's pre-fork mode: one listening socket, ``--workers`` single-threaded worker
processes accepting on it, each doing real CPU work per request.

The shape of gunicorn's sync workers (and of every pre-fork server): the listener binds the port
and forks the workers, which inherit the listening socket and accept on it in turn; the listener
itself serves nothing, it only forks a new worker whenever one exits -- a crash, or a worker that
served ``--max-requests`` and left (gunicorn's max_requests recycling).  A worker serves one
connection at a time and answers each request with ``Connection: close``, as a sync worker does (a
kept-alive connection would hold a worker that has nothing else to do).

Each inference request costs ``--cpu-ms`` of the worker's own CPU time (time.thread_time: the
hashing below runs until the process has used that much, however long the CPUs make it wait), so
the truth is known: N workers on C CPUs serve at most min(N, C) x 1000 / cpu_ms requests/s, and a
closed loop saturates at min(N, C) users with the CPUs full.

Endpoints: KServe v2 -- GET /v2, /v2/health/live, /v2/health/ready, /v2/models/{name}[/ready],
POST /v2/models/{name}[/versions/{v}]/infer (any JSON body: one [1, 1] FP32 output) -- and
TorchServe's GET /ping, POST /predictions/{name}.  Standard library only in the workers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import socket
import time
from typing import Any, Callable

logger = logging.getLogger(__name__)

DEFAULT_WORKERS = 4
DEFAULT_CPU_MS = 20.0
HASH_CHUNK = b"\x5a" * 65536  # bytes hashed between two looks at the CPU clock (~0.1 ms)
MAX_HEADER_BYTES = 65536  # a request head longer than this is refused (400)
MAX_BODY_BYTES = 64 << 20
RECV_TIMEOUT_S = 30.0  # a client that sends nothing for this long loses its connection
RESPAWN_PAUSE_S = 0.1  # the listener waits this long before forking again after a worker died at once
STOP_WAIT_S = 5.0  # seconds the listener waits for its workers after SIGTERM before SIGKILL


def burn(cpu_s: float) -> None:
    """Use ``cpu_s`` seconds of this thread's CPU time (real work: SHA-256 of HASH_CHUNK)."""
    h = hashlib.sha256()
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        h.update(HASH_CHUNK)


def _read_request(conn: socket.socket) -> tuple[str, str, bytes] | None:
    """(method, path, body) of one HTTP/1.x request; None when the client sent nothing."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = conn.recv(65536)
        if not chunk:
            return None if not buf else ("", "", b"")
        buf += chunk
        if len(buf) > MAX_HEADER_BYTES:
            return "", "", b""
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split()
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip() or 0)
    if len(parts) < 2 or length > MAX_BODY_BYTES:
        return "", "", b""
    while len(body) < length:
        chunk = conn.recv(min(65536, length - len(body)))
        if not chunk:
            break
        body += chunk
    return parts[0], parts[1].split("?")[0], body


def _answer(conn: socket.socket, status: int, doc: Any) -> None:
    body = json.dumps(doc).encode()
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "OK")
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode()
    conn.sendall(head + body)


class Worker:
    """One worker process's loop: accept, answer, close; ``max_requests`` inference requests, then exit."""

    def __init__(self, sock: socket.socket, model: str, cpu_s: float, max_requests: int) -> None:
        self.sock, self.model, self.cpu_s, self.max_requests = sock, model, cpu_s, max_requests
        self.served = 0

    def route(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        parts = [p for p in path.split("/") if p]
        if method == "GET":
            if path in ("/v2/health/live", "/v2/health/ready", "/ping"):
                return 200, {"live": True, "ready": True, "status": "Healthy"}
            if path == "/v2":
                return 200, {"name": "kneeswarm-target-prefork", "version": "0.1.0", "extensions": []}
            if parts[:2] == ["v2", "models"] and len(parts) >= 3:
                return (200, {"name": parts[2], "ready": True}) if parts[2] == self.model else \
                    (404, {"error": f"unknown model {parts[2]!r}"})
            return 404, {"error": f"GET {path}: not found"}
        infer = parts[:2] == ["v2", "models"] and parts[-1] == "infer" and len(parts) >= 4
        predict = parts[:1] == ["predictions"] and len(parts) >= 2
        if method != "POST" or not (infer or predict):
            return 404, {"error": f"{method} {path}: not found"}
        name = parts[2] if infer else parts[1]
        if name != self.model:
            return 404, {"error": f"unknown model {name!r}: this server serves {self.model!r}"}
        try:
            request = json.loads(body or b"{}")
        except ValueError as exc:
            return 400, {"error": f"body is not valid JSON: {exc}"}
        burn(self.cpu_s)
        self.served += 1
        if predict:
            return 200, {"predictions": [[0.0]]}
        rid = request.get("id") if isinstance(request, dict) else None
        return 200, {"model_name": self.model, "model_version": "1", "id": rid if isinstance(rid, str) else "",
                     "outputs": [{"name": "output", "shape": [1, 1], "datatype": "FP32", "data": [0.0]}]}

    def run(self) -> None:
        while not self.max_requests or self.served < self.max_requests:
            conn, _ = self.sock.accept()
            with conn:
                conn.settimeout(RECV_TIMEOUT_S)
                try:
                    req = _read_request(conn)
                    if req is None:
                        continue
                    status, doc = self.route(*req) if req[0] else (400, {"error": "malformed request"})
                    _answer(conn, status, doc)
                except (OSError, ValueError):
                    continue  # the client went away, or sent garbage: the next one


def _fork_worker(sock: socket.socket, model: str, cpu_s: float, max_requests: int) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        Worker(sock, model, cpu_s, max_requests).run()
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def serve(sock: socket.socket, workers: int, model: str, cpu_ms: float, max_requests: int,
          announce: Callable[[], None]) -> int:
    """The listener: fork ``workers`` workers on ``sock``, fork another whenever one exits, until
    SIGTERM or SIGINT (then stop them); 0 on a clean stop."""
    stopping = False
    pids: set[int] = set()

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True
        for pid in list(pids):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    cpu_s = cpu_ms / 1000.0
    for _ in range(workers):
        pids.add(_fork_worker(sock, model, cpu_s, max_requests))
    announce()
    deadline = None
    while pids:
        if stopping and deadline is None:
            deadline = time.monotonic() + STOP_WAIT_S
        if deadline is not None and time.monotonic() > deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        pid, _ = os.waitpid(-1, 0 if not stopping else os.WNOHANG)
        if pid == 0:
            time.sleep(0.05)
            continue
        pids.discard(pid)
        if not stopping and not max_requests:
            time.sleep(RESPAWN_PAUSE_S)  # a worker that died (not recycled): no fork loop at full speed
        if not stopping:
            pids.add(_fork_worker(sock, model, cpu_s, max_requests))
    sock.close()
    return 0

"""What happens to a request before the application sees it: the API key, and injected faults.

``Gate`` is a plain ASGI middleware wrapped around the whole application, so that the ``send``
it receives is uvicorn's own: through it (``send.__self__``, uvicorn's request-response cycle)
it reaches the connection's transport, which a reset or a truncation needs.

- API key (``--api-key-env NAME``): every request except health and metrics must carry
  ``Authorization: Bearer $NAME`` or gets 401; both outcomes are counted
  (``kneeswarm_target_auth_total{result}``).
- Faults, on inference requests (every POST), each drawn independently from a seeded RNG and
  counted in ``kneeswarm_target_faults_total{kind}`` only when applied:
  ``--reset-rate`` closes the connection with a TCP RST and no answer; ``--fail-rate`` answers
  500; ``--truncate-rate`` cuts a streamed (text/event-stream) answer after its first
  ``TRUNCATE_AFTER`` body writes, closing the connection without the end of the stream;
  ``--stall-ms``/``--stall-every`` holds every request that arrives inside a stall window
  (the first ``stall_ms`` of every ``stall_every`` seconds since start) until the window ends.
- Disk IO (``--write-kb N --write-file PATH``): before it is served, every inference request
  appends N KiB to PATH and fsyncs it, in a thread of its own (synchronous disk IO, as a service
  that logs or loads per request does), counted in ``kneeswarm_target_faults_total{kind="write"}``.
- CPU cost growing with concurrency (``--cpu-work-per-inflight K``): before it is served, every
  inference request computes K x (inference requests in flight when it arrives, itself included)
  units of numpy work (WORK_UNIT_FLOATS sines; the GIL released) in a thread of its own: past one
  user each request costs more CPU for the same answer, as past the memory-bandwidth wall.  The
  units are counted in ``kneeswarm_target_faults_total{kind="cpu_work_units"}``.
- Threads fighting over a lock (``--spin-wait K``): at most K inference requests are let through
  at once; the others wait for a place in a thread of their own (asyncio's default executor) by
  spinning on a try-lock and calling ``sched_yield()`` between tries, as a spin-then-yield lock
  does.  Below K in service nothing waits; past it the waiting threads burn CPU in the kernel
  (sched_yield, the GIL's futex) and switch on every try.  With ``--mode knee --slots K`` the
  knee stays at K users.  Each yield is counted in ``kneeswarm_target_faults_total{kind="spin_yield"}``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from kneeswarm.target.metrics import TargetMetrics

logger = logging.getLogger(__name__)

OPEN_PATHS = ("/v2/health/", "/health", "/ping", "/metrics")  # never need the API key
ARRIVED = "kneeswarm.arrived"  # scope key: perf_counter() when the request reached the application
TRUNCATE_AFTER = 3  # body writes (SSE chunks) sent before a truncated stream is cut
WORK_UNIT_FLOATS = 65536  # one unit of --cpu-work-per-inflight: sin() of this many float64 (~0.4 ms here)


@dataclass(frozen=True)
class FaultPlan:
    fail_rate: float = 0.0
    reset_rate: float = 0.0
    truncate_rate: float = 0.0
    stall_ms: float = 0.0
    stall_every: float = 0.0  # seconds
    seed: int = 0
    fail_above: int = 0  # > 0: an inference request arriving with more than this many in service (itself included) gets 500
    write_kb: int = 0  # KiB appended and fsynced per inference request, to write_file
    write_file: str | None = None
    cpu_work_per_inflight: int = 0  # units of CPU work per request x requests in flight
    spin_wait: int = 0  # > 0: at most this many requests let through at once, the others spin-yield for a place


class Gate:
    def __init__(self, app: Any, metrics: TargetMetrics, faults: FaultPlan, api_key_env: str | None = None):
        self.app = app
        self.metrics = metrics
        self.faults = faults
        self.rng = random.Random(faults.seed)
        self.started = time.monotonic()
        self.expected = None
        if api_key_env:
            key = os.environ.get(api_key_env, "")
            if not key:
                raise ValueError(f"--api-key-env {api_key_env}: the environment variable is not set")
            self.expected = f"Bearer {key}".encode()
        self.write_fd = None
        self.inflight = 0
        self.admitted = 0  # requests past the --spin-wait gate
        self.admit_lock = threading.Lock()
        if faults.write_kb > 0:
            if not faults.write_file:
                raise ValueError("--write-kb needs --write-file PATH")
            self.write_fd = os.open(faults.write_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope[ARRIVED] = time.perf_counter()  # the earliest the application can see a request
        if self.expected is not None and not scope["path"].startswith(OPEN_PATHS):
            given = dict(scope["headers"]).get(b"authorization")
            ok = given == self.expected
            self.metrics.auth.labels(result="ok" if ok else "rejected").inc()
            if not ok:
                await _json(send, 401, {"error": "missing or wrong API key"})
                return
        if scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        await self._inference(scope, receive, send)

    async def _inference(self, scope: dict, receive: Any, send: Any) -> None:
        f, rng = self.faults, self.rng
        reset, fail, truncate = rng.random() < f.reset_rate, rng.random() < f.fail_rate, rng.random() < f.truncate_rate
        await self._stall()
        if self.write_fd is not None:
            await asyncio.to_thread(self._write, self.write_fd)
        if f.spin_wait > 0:
            await self._admit()
            try:
                await self._served(scope, receive, send, reset, fail, truncate)
            finally:
                with self.admit_lock:
                    self.admitted -= 1
            return
        await self._served(scope, receive, send, reset, fail, truncate)

    async def _served(self, scope: dict, receive: Any, send: Any, reset: bool, fail: bool, truncate: bool) -> None:
        f = self.faults
        self.inflight += 1
        try:
            if f.fail_above and self.inflight > f.fail_above:  # --fail-above: fails above N in service
                self.metrics.faults.labels(kind="fail").inc()
                self.metrics.requests.labels(code="500").inc()
                await _json(send, 500, {"error": f"more than {f.fail_above} in service (--fail-above)"})
                return
            if f.cpu_work_per_inflight > 0:
                await asyncio.to_thread(self._work, f.cpu_work_per_inflight * self.inflight)
            await self._faulted(scope, receive, send, reset, fail, truncate)
        finally:
            self.inflight -= 1

    async def _faulted(self, scope: dict, receive: Any, send: Any, reset: bool, fail: bool, truncate: bool) -> None:
        if reset and _reset(send):
            self.metrics.faults.labels(kind="reset").inc()
            return
        if fail:
            self.metrics.faults.labels(kind="fail").inc()
            self.metrics.requests.labels(code="500").inc()
            await _json(send, 500, {"error": "injected failure (--fail-rate)"})
            return
        await self.app(scope, receive, self._truncating(send) if truncate else send)

    async def _stall(self) -> None:
        f = self.faults
        if not (f.stall_ms > 0 and f.stall_every > 0):
            return
        since = (time.monotonic() - self.started) % f.stall_every
        if since < f.stall_ms / 1000.0:
            self.metrics.faults.labels(kind="stall").inc()
            await asyncio.sleep(f.stall_ms / 1000.0 - since)

    def _work(self, units: int) -> None:
        x = np.linspace(0.0, 1.0, WORK_UNIT_FLOATS)
        y = np.empty_like(x)
        for _ in range(units):
            np.sin(x, out=y)
        self.metrics.faults.labels(kind="cpu_work_units").inc(units)

    async def _admit(self) -> None:
        """One of the --spin-wait places, waited for in a thread; a request cancelled meanwhile
        (its client gone) gives its place back, or stops the thread from taking one."""
        state = {"gave_up": False, "admitted": False}
        try:
            await asyncio.to_thread(self._spin_admit, state)
        except asyncio.CancelledError:
            with self.admit_lock:
                state["gave_up"] = True
                if state["admitted"]:
                    self.admitted -= 1
            raise

    def _spin_admit(self, state: dict[str, bool]) -> None:
        """Wait for a place by spinning: try the lock, yield the CPU (sched_yield), try again."""
        yields = 0
        while True:
            with self.admit_lock:
                if state["gave_up"]:
                    break
                if self.admitted < self.faults.spin_wait:
                    self.admitted += 1
                    state["admitted"] = True
                    break
            os.sched_yield()
            yields += 1
        if yields:
            self.metrics.faults.labels(kind="spin_yield").inc(yields)

    def _write(self, fd: int) -> None:
        os.write(fd, b"\0" * (1024 * self.faults.write_kb))
        os.fsync(fd)
        self.metrics.faults.labels(kind="write").inc()

    def _truncating(self, send: Any) -> Any:
        """``send`` that cuts an event stream after TRUNCATE_AFTER body writes (others pass whole)."""
        state = {"stream": False, "writes": 0, "cut": False}

        async def cut_send(message: dict) -> None:
            if state["cut"]:
                return
            if message["type"] == "http.response.start":
                ctype = dict(message.get("headers") or []).get(b"content-type", b"")
                state["stream"] = ctype.startswith(b"text/event-stream")
            elif message["type"] == "http.response.body" and state["stream"]:
                state["writes"] += 1
                if state["writes"] > TRUNCATE_AFTER and message.get("more_body"):
                    cycle = getattr(send, "__self__", None)
                    if cycle is not None:
                        state["cut"] = True
                        self.metrics.faults.labels(kind="truncate").inc()
                        cycle.transport.close()  # FIN after what was sent: no final chunk, no [DONE]
                        cycle.disconnected = True  # uvicorn drops the rest quietly
                        return
            await send(message)

        return cut_send


def _reset(send: Any) -> bool:
    """Abort the connection with a TCP RST (SO_LINGER 0); False when uvicorn's transport is out of reach."""
    cycle = getattr(send, "__self__", None)
    transport = getattr(cycle, "transport", None)
    if cycle is None or transport is None:
        return False
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    transport.abort()
    cycle.disconnected = True
    return True


async def _json(send: Any, status: int, doc: dict) -> None:
    body = json.dumps(doc).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})

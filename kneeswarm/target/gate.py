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
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any

from kneeswarm.target.metrics import TargetMetrics

logger = logging.getLogger(__name__)

OPEN_PATHS = ("/v2/health/", "/health", "/ping", "/metrics")  # never need the API key
ARRIVED = "kneeswarm.arrived"  # scope key: perf_counter() when the request reached the application
TRUNCATE_AFTER = 3  # body writes (SSE chunks) sent before a truncated stream is cut


@dataclass(frozen=True)
class FaultPlan:
    fail_rate: float = 0.0
    reset_rate: float = 0.0
    truncate_rate: float = 0.0
    stall_ms: float = 0.0
    stall_every: float = 0.0  # seconds
    seed: int = 0


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
    if transport is None:
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

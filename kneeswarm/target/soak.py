"""What a soak run is meant to catch, on purpose: a leak and a slow latency drift (to test the soak findings).

``Soak`` is a plain ASGI middleware around the application, applied to inference requests
(every POST) only:

- ``--leak-kb-per-request K`` keeps K kB of written bytes per request for the life of the
  process (the memory is touched, so it shows in RSS at once): RSS grows by K kB x QPS.
- ``--drift-ms-per-min D`` holds each request D ms longer for every minute since the first
  inference request, before the application sees it: latency rises linearly at D ms/min while
  the engine's own service time stays as it was.
- ``--leak-fd-every N`` opens /dev/null once every N requests and never closes it: the process's
  open file descriptors grow by QPS / N a second (a connection or file never closed).
- ``--leak-thread-every N`` starts a thread once every N requests that waits forever: the
  process's threads grow by QPS / N a second (a thread started per request, never joined).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from typing import Any

logger = logging.getLogger(__name__)


class Soak:
    def __init__(self, app: Any, leak_kb_per_request: float = 0.0, drift_ms_per_min: float = 0.0,
                 leak_fd_every: int = 0, leak_thread_every: int = 0):
        self.app = app
        self.fd_every, self.thread_every = leak_fd_every, leak_thread_every
        self.requests = 0
        self.leaked_fds: list[int] = []  # never closed
        self.never = threading.Event()  # never set: the leaked threads wait on it
        self.leak_bytes = int(round(leak_kb_per_request * 1024))
        self.drift_s_per_s = drift_ms_per_min / 1000.0 / 60.0
        self.leaked: list[bytes] = []  # never freed: the leak
        self.first: float | None = None  # monotonic time of the first inference request

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        now = time.monotonic()
        if self.first is None:
            self.first = now
        if self.leak_bytes:
            self.leaked.append(b"\x01" * self.leak_bytes)
        self.requests += 1
        if self.fd_every and self.requests % self.fd_every == 0:
            self.leaked_fds.append(os.open(os.devnull, os.O_RDONLY))
        if self.thread_every and self.requests % self.thread_every == 0:
            threading.Thread(target=self.never.wait, name="kneeswarm-leaked", daemon=True).start()
        if self.drift_s_per_s > 0:
            await asyncio.sleep(self.drift_s_per_s * (now - self.first))
        await self.app(scope, receive, send)

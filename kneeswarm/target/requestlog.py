"""``--request-log PATH``: what arrived, one JSON line per POST request, for tests and replays.

``{"t": arrival (Unix epoch seconds, when the request's headers were parsed), "path": "/v1/...",
"body": the body as text}``, written when the application has read the whole body, in the order
the bodies were read.  A plain ASGI middleware outside everything else (the fault gate included,
whose ``send`` it leaves untouched); a request whose body is never read is not logged.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

logger = logging.getLogger(__name__)


class RequestLog:
    def __init__(self, app: Any, path: str):
        self.app = app
        self.file = open(path, "a", buffering=1, encoding="utf-8")  # line-buffered: a line per request

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        arrived, parts = time.time(), []

        async def logged() -> dict:
            message = await receive()
            if message["type"] == "http.request":
                parts.append(message.get("body", b""))
                if not message.get("more_body"):
                    self.write(arrived, scope["path"], b"".join(parts))
            return message

        await self.app(scope, logged, send)

    def write(self, arrived: float, path: str, body: bytes) -> None:
        line = json.dumps({"t": arrived, "path": path, "body": body.decode("utf-8", "replace")})
        self.file.write(line + "\n")

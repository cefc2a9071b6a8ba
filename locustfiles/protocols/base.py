"""The protocol interface shared by every inference protocol."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class BadPayload(Exception):
    """The server answered 2xx but the body is not a valid inference response."""


@dataclass(frozen=True)
class PreparedRequest:
    method: str
    path: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    tokens_in: int | None = None


class Protocol:
    """Builds request bodies for one user and checks the answers.

    ``request_cfg`` is the plan's [request] table as a dict; ``seed`` makes each user's
    inputs different but reproducible.
    """

    name = "base"
    health_path = "/"

    def __init__(self, request_cfg: dict[str, Any], seed: int = 0):
        self.cfg = request_cfg
        self.seed = seed

    def next_request(self) -> PreparedRequest:  # pragma: no cover - interface
        raise NotImplementedError

    def check_response(self, body: bytes) -> int | None:
        """Raise BadPayload if ``body`` is not a valid answer; return tokens_out when known."""
        raise NotImplementedError  # pragma: no cover - interface

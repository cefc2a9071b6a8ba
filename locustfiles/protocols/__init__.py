"""Inference protocols: how to build a request body and judge a response.

A protocol knows nothing about Locust or recording; the user class in users.py drives it.
Adding a protocol is one module here plus one line in PROTOCOLS.
"""

from __future__ import annotations

from locustfiles.protocols.base import BadPayload, Protocol, PreparedRequest
from locustfiles.protocols.kserve import KServeV2

PROTOCOLS: dict[str, type[Protocol]] = {"kserve": KServeV2}

__all__ = ["BadPayload", "Protocol", "PreparedRequest", "PROTOCOLS", "KServeV2"]

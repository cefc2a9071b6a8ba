"""Any JSON-over-HTTP endpoint: a body template, a path, a health path and a success check.

    protocol = "http"
    [request]
    path = "/score"
    body = '{"model": "{{model}}", "text": "{{prompt}}", "x": {{data}}}'
    health_path = "/healthz"          # default "/"
    success_path = "result.0.score"   # optional: must be present in every 2xx answer

Placeholders: ``{{model}}`` (request.model), ``{{prompt}}`` (a synthetic prompt of
``prompt_tokens`` words, JSON-escaped, or ``request.prompt``), ``{{data}}`` (a JSON array of
``shape`` values of ``datatype``, batched like the tensor protocols), ``{{user}}`` (the user's
seed).  Each filled template must be valid JSON (checked at start, one line if not).  Success:
a 2xx status and, with ``success_path``, that JSON path (dots; integers index lists) present and
not null.  Preflight: the health path answers 2xx, then one real request succeeds.
"""

from __future__ import annotations

import json
import logging
import math
import random

from kneeswarm.contracts.plan import EndpointPlan
from kneeswarm.locustfiles.protocols.base import (BODY_VARIANTS, BadPayload, PreflightError, PreparedRequest, Protocol, ProtocolError, Tokens, json_path, parse_json)
from kneeswarm.locustfiles.protocols.openai import WORDS
from kneeswarm.locustfiles.protocols.tensors import batched, nested, values

logger = logging.getLogger(__name__)

DEFAULT_BODY = '{"data": {{data}}}'


class GenericHTTP(Protocol):
    name = "http"
    health_path = "/"

    def __init__(self, request_cfg: dict, seed: int = 0, endpoint: EndpointPlan | None = None):
        super().__init__(request_cfg, seed, endpoint)
        self.path = request_cfg.get("path") or "/"
        self.method = str(request_cfg.get("method", "POST")).upper()
        self.success_path = request_cfg.get("success_path")
        template = request_cfg.get("body") or DEFAULT_BODY
        rng = random.Random(f"{request_cfg.get('seed', 0)}:{seed}")
        fixed = request_cfg.get("data", "random") == "fixed"
        self._requests = [self._fill(template, rng, fixed) for _ in range(1 if fixed else BODY_VARIANTS)]
        self._i = 0

    def _fill(self, template: str, rng: random.Random, fixed: bool) -> PreparedRequest:
        shape = batched(list(self.cfg.get("shape", [1, 64])), int(self.cfg.get("batch", 1) or 1))
        words = str(self.cfg["prompt"]) if self.cfg.get("prompt") else " ".join(
            rng.choice(WORDS) for _ in range(int(self.cfg.get("prompt_tokens", 32))))
        fills = {
            "{{model}}": json.dumps(str(self.cfg.get("model", "demo")))[1:-1],
            "{{prompt}}": json.dumps(words)[1:-1],
            "{{user}}": str(self.seed),
        }
        if "{{data}}" in template:
            flat = values(rng, str(self.cfg.get("datatype", "FP32")), math.prod(shape), fixed)
            fills["{{data}}"] = json.dumps(nested(flat, shape), separators=(",", ":"))
        body = template
        for key, value in fills.items():
            body = body.replace(key, value)
        if self.method != "GET":
            try:
                json.loads(body)
            except ValueError as e:
                raise ProtocolError(f"request.body is not JSON once filled ({e}): {body[:80]!r}") from None
        tokens = len(words.split()) if "{{prompt}}" in template else None
        return PreparedRequest(self.method, self.path, body.encode() if self.method != "GET" else b"",
                               self.headers, tokens_in=tokens, items=shape[0])

    def check_response(self, body: bytes) -> Tokens | None:
        if not self.success_path:
            return None
        try:
            doc = parse_json(body)
        except (ValueError, TypeError) as e:
            raise BadPayload(f"response is not JSON: {e}") from None
        try:
            found = json_path(doc, self.success_path)
        except (KeyError, IndexError, TypeError):
            raise BadPayload(f"response has no {self.success_path!r}") from None
        if found is None:
            raise BadPayload(f"response's {self.success_path!r} is null")
        return None

    def preflight(self, base_url: str, timeout: float = 10.0) -> None:
        r = self._http("GET", base_url, self.health_path, timeout)
        if not 200 <= r.status_code < 300:
            raise PreflightError(self._refusal(base_url, f"GET {self.health_path}", r))
        self.probe(base_url, timeout)

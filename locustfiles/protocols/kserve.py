"""KServe v2 / Triton HTTP inference protocol (Open Inference Protocol, JSON tensors).

Request:  POST /v2/models/{model}[/versions/{version}]/infer
          {"inputs": [{"name": "input", "shape": [B, 64], "datatype": "FP32", "data": [...]}, ...]}
Response: {"model_name": ..., "outputs": [{"name": ..., "shape": [...], "datatype": ..., "data": [...]}]}
Health:   GET /v2/health/ready;  preflight: GET /v2/models/{model}[/versions/{version}]/ready

Inputs come from ``[[request.inputs]]`` (name, shape, datatype; several per request, as Triton
ensembles and multi-input models need) or else from ``shape``/``datatype``/``input_name``.
``batch`` replaces the first dimension of every input's shape.  Data is flat, row-major, as
the protocol allows (Triton and KServe accept it).
"""

from __future__ import annotations

import json
import logging
import math
import random

from kneeswarm.contracts.plan import EndpointPlan
from kneeswarm.locustfiles.protocols.base import (BODY_VARIANTS, BadPayload, PreflightError, PreparedRequest, Protocol, Tokens)
from kneeswarm.locustfiles.protocols.tensors import batched, values

logger = logging.getLogger(__name__)

INPUT_NAME = "input"


class KServeV2(Protocol):
    name = "kserve"
    health_path = "/v2/health/ready"

    def __init__(self, request_cfg: dict, seed: int = 0, endpoint: EndpointPlan | None = None):
        super().__init__(request_cfg, seed, endpoint)
        model = request_cfg.get("model", "demo")
        version = request_cfg.get("version")
        self.model_path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "")
        self.path = request_cfg.get("path") or f"{self.model_path}/infer"
        self.batch = int(request_cfg.get("batch", 1) or 1)
        rng = random.Random(f"{request_cfg.get('seed', 0)}:{seed}")
        fixed = request_cfg.get("data", "random") == "fixed"
        specs = self.input_specs()
        self._requests = [
            PreparedRequest("POST", self.path, json.dumps(
                {"inputs": [{**spec, "data": values(rng, spec["datatype"], math.prod(spec["shape"]), fixed)}
                            for spec in specs]},
                separators=(",", ":"),
            ).encode(), self.headers, items=self.batch)
            for _ in range(1 if fixed else BODY_VARIANTS)
        ]
        self._i = 0

    def input_specs(self) -> list[dict]:
        """[{name, shape, datatype}] of every input, the batch applied."""
        given = self.cfg.get("inputs") or [{
            "name": self.cfg.get("input_name") or INPUT_NAME,
            "shape": list(self.cfg.get("shape", [1, 64])),
            "datatype": self.cfg.get("datatype", "FP32"),
        }]
        return [{"name": s["name"], "shape": batched(list(s["shape"]), self.batch),
                 "datatype": str(s.get("datatype", "FP32")).upper()} for s in given]

    def check_response(self, body: bytes) -> Tokens | None:
        # The hot path: a structural check costs ~0.3 us where json.loads costs ~3 us per
        # request (measured with bench/generator.py). A body that fails it is parsed in full,
        # so the error says what is wrong.
        i = body.find(b'"outputs"')
        if i > 0 and body[:1] == b"{" and body.rstrip()[-1:] == b"}":
            after = body[i + 9 : i + 24].replace(b" ", b"")
            if after[:2] == b":[" and after[2:3] != b"]":
                return None
        try:
            doc = json.loads(body)
        except (ValueError, TypeError) as e:
            raise BadPayload(f"response is not JSON: {e}") from None
        outputs = doc.get("outputs") if isinstance(doc, dict) else None
        if not isinstance(outputs, list) or not outputs:
            raise BadPayload("response has no 'outputs' list")
        return None

    def preflight(self, base_url: str, timeout: float = 10.0) -> None:
        what = f"GET {self.model_path}/ready"
        r = self._http("GET", base_url, f"{self.model_path}/ready", timeout)
        if r.status_code == 404:
            raise PreflightError(self.redact(
                f"model {self.cfg.get('model', 'demo')!r} is not served: {self._refusal(base_url, what, r)}"))
        if not 200 <= r.status_code < 300:
            raise PreflightError(self._refusal(base_url, what, r))

"""KServe v2 / Triton HTTP inference protocol (JSON tensors).

Request:  POST /v2/models/{model}/infer
          {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [...]}]}
Response: {"model_name": ..., "outputs": [{"name": ..., "shape": [...], "datatype": ..., "data": [...]}]}
"""

from __future__ import annotations

import json
import math
import random

from locustfiles.protocols.base import BadPayload, PreparedRequest, Protocol

BODY_VARIANTS = 16  # distinct random bodies pre-built per user (keeps the generator's CPU low)
INPUT_NAME = "input"
_INT_TYPES = {"INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"}


class KServeV2(Protocol):
    name = "kserve"
    health_path = "/v2/health/ready"

    def __init__(self, request_cfg: dict, seed: int = 0):
        super().__init__(request_cfg, seed)
        model = request_cfg.get("model", "demo")
        self.path = f"/v2/models/{model}/infer"
        shape = list(request_cfg.get("shape", [1, 64]))
        datatype = str(request_cfg.get("datatype", "FP32")).upper()
        n = math.prod(shape)
        rng = random.Random(f"{request_cfg.get('seed', 0)}:{seed}")
        fixed = request_cfg.get("data", "random") == "fixed"
        variants = 1 if fixed else BODY_VARIANTS

        def value() -> float | int:
            if fixed:
                return 1 if datatype in _INT_TYPES else 0.5
            return rng.randint(0, 100) if datatype in _INT_TYPES else round(rng.uniform(-1, 1), 4)

        self._bodies = [
            json.dumps(
                {"inputs": [{"name": INPUT_NAME, "shape": shape, "datatype": datatype, "data": [value() for _ in range(n)]}]},
                separators=(",", ":"),
            ).encode()
            for _ in range(variants)
        ]
        self._i = 0
        self._headers = {"Content-Type": "application/json"}

    def next_request(self) -> PreparedRequest:
        body = self._bodies[self._i % len(self._bodies)]
        self._i += 1
        return PreparedRequest("POST", self.path, body, self._headers)

    def check_response(self, body: bytes) -> int | None:
        try:
            doc = json.loads(body)
        except (ValueError, TypeError) as e:
            raise BadPayload(f"response is not JSON: {e}") from None
        outputs = doc.get("outputs") if isinstance(doc, dict) else None
        if not isinstance(outputs, list) or not outputs:
            raise BadPayload("response has no 'outputs' list")
        return None

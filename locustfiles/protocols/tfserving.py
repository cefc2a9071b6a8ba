"""TensorFlow Serving REST API: POST /v1/models/{model}[/versions/{v}]:predict, row format.

Request:  {"instances": [item, ...]}   (``batch`` items, each of shape ``shape[1:]``)
Response: {"predictions": [...]}       (errors: {"error": "..."})
Health and preflight: GET /v1/models/{model}[/versions/{v}] -> {"model_version_status":
[{"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK"}}]}; a model that is not
AVAILABLE, or a 404, stops the run before any load.

KServe's v1 protocol is the same REST shape (``:predict``, ``instances`` -> ``predictions``), but its
model status is ``{"name": "m", "ready": true}`` (kserve.protocol.rest.v1_endpoints): ``ready``
true counts as AVAILABLE (found by the conformance suite against KServe 0.21.0, whose v1 model
was refused as "not AVAILABLE (states [])").
"""

from __future__ import annotations

import json
import logging

from kneeswarm.contracts.plan import EndpointPlan
from kneeswarm.locustfiles.protocols.base import BadPayload, PreflightError, Protocol, Tokens
from kneeswarm.locustfiles.protocols.tensors import json_tensor_requests

logger = logging.getLogger(__name__)


class TFServing(Protocol):
    name = "tfserving"

    def __init__(self, request_cfg: dict, seed: int = 0, endpoint: EndpointPlan | None = None):
        super().__init__(request_cfg, seed, endpoint)
        model, version = request_cfg.get("model", "demo"), request_cfg.get("version")
        self.model_path = f"/v1/models/{model}" + (f"/versions/{version}" if version else "")
        if not request_cfg.get("health_path"):
            self.health_path = self.model_path
        self.path = request_cfg.get("path") or f"{self.model_path}:predict"
        self.batch = int(request_cfg.get("batch", 1) or 1)
        item = list(request_cfg.get("shape", [1, 64]))[1:] or [1]
        shape = [self.batch, *item]
        self._requests = json_tensor_requests(self.path, self.headers, "instances", shape, request_cfg, seed, self.batch)

    def check_response(self, body: bytes) -> Tokens | None:
        # Cheap structural check first (as kserve does); a failing body is parsed for the message.
        if body[:1] == b"{" and b'"predictions"' in body[:64]:
            return None
        try:
            doc = json.loads(body)
        except (ValueError, TypeError) as e:
            raise BadPayload(f"response is not JSON: {e}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("predictions", doc.get("outputs")), (list, dict)):
            raise BadPayload("response has no 'predictions'")
        return None

    def preflight(self, base_url: str, timeout: float = 10.0) -> None:
        what = f"GET {self.model_path}"
        r = self._http("GET", base_url, self.model_path, timeout)
        model = self.cfg.get("model", "demo")
        if r.status_code == 404:
            raise PreflightError(self.redact(f"model {model!r} is not served: {self._refusal(base_url, what, r)}"))
        if not 200 <= r.status_code < 300:
            raise PreflightError(self._refusal(base_url, what, r))
        try:
            doc = r.json()
            states = [s.get("state") for s in doc.get("model_version_status", [])]
        except (ValueError, AttributeError):
            doc, states = None, []
        if isinstance(doc, dict) and "model_version_status" not in doc and isinstance(doc.get("ready"), bool):
            if not doc["ready"]:  # KServe v1
                raise PreflightError(self.redact(f"{base_url}: model {model!r} is not ready ({what}: ready false)"))
            return
        if "AVAILABLE" not in states:
            raise PreflightError(self.redact(f"{base_url}: model {model!r} is not AVAILABLE ({what}: states {states})"))

"""TorchServe inference API: POST /predictions/{model}[/{version}], health GET /ping.

TorchServe hands the body to the model's handler, so its shape is the handler's business; this
module sends JSON ``{"data": <nested list of shape [batch, ...]>}``, which the stock handlers'
``preprocess`` reads from the ``data`` (or ``body``) field.  ``request.body`` with the http
protocol covers any other handler.  TorchServe batches on the server (``batch_size`` in the
model's config), so one request carries one item unless the handler takes a list.

Preflight: ``/ping`` must say Healthy, then one real prediction: an unknown model is TorchServe's
404 ``ModelNotFoundException`` (its management API, ``GET :8081/models/{m}``, is on another
port and often not reachable from the load machine).
"""

from __future__ import annotations

import logging

from kneeswarm.contracts.plan import EndpointPlan
from kneeswarm.locustfiles.protocols.base import BadPayload, PreflightError, Protocol, Tokens
from kneeswarm.locustfiles.protocols.tensors import batched, json_tensor_requests

logger = logging.getLogger(__name__)


class TorchServe(Protocol):
    name = "torchserve"
    health_path = "/ping"

    def __init__(self, request_cfg: dict, seed: int = 0, endpoint: EndpointPlan | None = None):
        super().__init__(request_cfg, seed, endpoint)
        model, version = request_cfg.get("model", "demo"), request_cfg.get("version")
        self.path = request_cfg.get("path") or f"/predictions/{model}" + (f"/{version}" if version else "")
        self.batch = int(request_cfg.get("batch", 1) or 1)
        shape = batched(list(request_cfg.get("shape", [1, 64])), self.batch)
        self._requests = json_tensor_requests(self.path, self.headers, "data", shape, request_cfg, seed, self.batch)

    def check_response(self, body: bytes) -> Tokens | None:
        # A handler may answer anything; an empty 2xx body is the one sure sign of trouble.
        if not body or not body.strip():
            raise BadPayload("empty response")
        return None

    def preflight(self, base_url: str, timeout: float = 10.0) -> None:
        r = self._http("GET", base_url, self.health_path, timeout)
        if not 200 <= r.status_code < 300:
            raise PreflightError(self._refusal(base_url, f"GET {self.health_path}", r))
        try:
            self.probe(base_url, timeout)
        except PreflightError as e:
            if "HTTP 404" in str(e):
                raise PreflightError(f"model {self.cfg.get('model', 'demo')!r} is not served: {e}") from None
            raise

"""The demo target's TorchServe and TensorFlow Serving endpoints, on the same engine as KServe.

TorchServe inference API:
    GET  /ping                                   {"status": "Healthy"}
    POST /predictions/{model}[/{version}]        {"data": [[...], ...]} (or "instances"/"inputs")
         -> {"predictions": [[...], ...]}; unknown model: 404 {"code": 404, "type":
         "ModelNotFoundException", "message": "Model not found: ..."} (TorchServe's own shape)
TensorFlow Serving REST API:
    GET  /v1/models/{model}[/versions/{v}]       {"model_version_status": [{"version", "state":
                                                 "AVAILABLE", "status": {...}}]}
    POST /v1/models/{model}[/versions/{v}]:predict   {"instances": [...]} -> {"predictions": [...]}

In onnx mode the rows must be numbers of the model's input width ([B, D]); in knee mode any
JSON is accepted and each request holds one slot.  With ``--models`` (mix.py) each model is
served under its own name for its own service time, and counted apart: TorchServe's
``ts_inference_requests_total{model_name}``, TF Serving's ``:tensorflow:serving:request_count{model_name,status}``.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kneeswarm.target.engine import Rejected
from kneeswarm.target.metrics import TargetMetrics
from kneeswarm.target.mix import MixEngine

logger = logging.getLogger(__name__)

MAX_ROWS = 1024
ROW_KEYS = ("data", "instances", "inputs", "body")


class BadRows(ValueError):
    """The body does not hold rows this model can take: 400."""


def rows_of(doc: Any, input_dim: int | None) -> tuple[np.ndarray | None, int]:
    """(the [B, input_dim] float32 rows, or None in knee mode; B)."""
    rows = next((doc[k] for k in ROW_KEYS if isinstance(doc, dict) and k in doc), None)
    if rows is None:
        raise BadRows(f"body must be a JSON object with one of {', '.join(ROW_KEYS)}")
    if input_dim is None:
        return None, len(rows) if isinstance(rows, list) else 1
    try:
        x = np.asarray(rows, dtype=np.float32)
    except (ValueError, TypeError):
        raise BadRows("rows must be a list of lists of numbers") from None
    if x.ndim != 2 or x.shape[1] != input_dim or not 1 <= x.shape[0] <= MAX_ROWS:
        raise BadRows(f"rows of shape {list(x.shape)}: expected [B, {input_dim}] with 1 <= B <= {MAX_ROWS}")
    if not np.isfinite(x).all():
        raise BadRows("rows hold NaN or infinity")
    return np.ascontiguousarray(x), x.shape[0]


# One function: the handlers share the engine, the metrics and the model name (closures).
def serving_routes(model_name: str, engine: Any, is_onnx: bool, input_dim: int, metrics: TargetMetrics,
                   ready: Any, also: tuple[str, ...] = ()) -> list[Route]:
    """TorchServe and TF Serving routes around ``engine``; ``ready()`` says whether the server is ready;
    ``also``: the further models of ``--models`` (``engine.infer(model)``: each its own cost)."""
    served = metrics.requests
    models = (model_name, *also)

    async def run(protocol: str, model: str, body: bytes, not_found: Any) -> Response:
        arrived = time.perf_counter()  # request_duration counts from here, as KServe's handler does
        try:
            doc = json.loads(body)
            x, items = rows_of(doc, input_dim if is_onnx else None)
        except (ValueError, BadRows) as e:
            served.labels(code="400").inc()
            return JSONResponse({"error": f"bad request: {e}"}, status_code=400)
        shape = "x".join(str(d) for d in (x.shape if x is not None else (items,)))
        metrics.record_received(protocol, model, items, [("rows", "FP32", shape)])
        if model not in models:
            served.labels(code="404").inc()
            return not_found(model)
        started = time.perf_counter()
        try:
            out = await engine.infer(x) if is_onnx else await (engine.infer(model) if isinstance(engine, MixEngine) else engine.infer())
        except Rejected as e:
            metrics.rejected.inc()
            served.labels(code="503").inc()
            return JSONResponse({"error": str(e)}, status_code=503)
        served.labels(code="200").inc()
        metrics.request_duration.observe(time.perf_counter() - arrived)
        if protocol == "torchserve":
            requests, latency_us = metrics.torchserve(model)
            requests.inc()
            latency_us.inc((time.perf_counter() - started) * 1e6)
        else:
            metrics.tf_requests.labels(model_name=model, status="OK").inc()
        predictions = out.tolist() if out is not None else [[0.0]] * items
        return JSONResponse({"predictions": predictions})

    def ts_missing(model: str) -> Response:
        return JSONResponse({"code": 404, "type": "ModelNotFoundException", "message": f"Model not found: {model}"},
                            status_code=404)

    def tf_missing(model: str) -> Response:
        return JSONResponse({"error": f"Servable not found for request: Latest({model})"}, status_code=404)

    async def ping(request: Request) -> Response:
        ok = ready()
        return JSONResponse({"status": "Healthy" if ok else "Unhealthy"}, status_code=200 if ok else 503)

    async def predictions(request: Request) -> Response:
        return await run("torchserve", request.path_params["name"], await request.body(), ts_missing)

    async def tf_models(request: Request) -> Response:
        rest = request.path_params["rest"]
        model, _, verb = rest.partition(":")
        model = model.split("/versions/")[0]
        if request.method == "POST":
            if verb != "predict":
                return JSONResponse({"error": f"unsupported verb {verb!r}: only :predict"}, status_code=404)
            return await run("tfserving", model, await request.body(), tf_missing)
        if model not in models:
            return tf_missing(model)
        state = "AVAILABLE" if ready() else "LOADING"
        return JSONResponse({"model_version_status": [
            {"version": "1", "state": state, "status": {"error_code": "OK", "error_message": ""}}]})

    return [
        Route("/ping", ping),
        Route("/predictions/{name}", predictions, methods=["POST"]),
        Route("/predictions/{name}/{version}", predictions, methods=["POST"]),
        Route("/v1/models/{rest:path}", tf_models, methods=["GET", "POST"]),
    ]

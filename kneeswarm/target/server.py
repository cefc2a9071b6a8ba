"""The bundled demo inference server: KServe v2, OpenAI, TorchServe and TF Serving on one port.

It stands apart from the rest of kneeswarm (imports none of it) and is used exactly as a real
inference server would be. Starlette serves the protocol, uvicorn the HTTP; run it with
``kneeswarm target ...`` or ``python -m kneeswarm.target ...``. The first line on stdout is

    kneeswarm target listening on http://HOST:PORT mode=MODE pid=PID

so that a parent process can start it on ``--port 0`` and read where it listens.

Modes
    ``--mode onnx`` (default): real ONNX Runtime inference of a seeded MLP generated at start-up
    (see model.py), behind the application's request pool (see engine.py): ``--request-threads``
    worker threads sharing one session, a ``--queue-size`` bounded queue in front of them (full
    queue: 503), ``--intra-op-threads``/``--inter-op-threads`` for ONNX Runtime, and optional
    micro-batching (``--batch-max``, ``--batch-wait-ms``). ``--work`` scales the cost of one
    inference (number of hidden layers).
    ``--mode knee``: ground truth. ``--slots K`` requests are served at once, each for
    ``--service-ms S`` without CPU work; in a closed loop QPS = min(users, K) * 1000 / S.
    ``--mode usl``: ground truth of the Universal Scalability Law. Every request is served at once
    for T * (1 + sigma (N - 1) + kappa N (N - 1)) ms (T = ``--service-ms``, ``--sigma``,
    ``--kappa``; N in service when it starts), sleeping; in a closed loop with N users
    QPS = 1000 N / that, peak at N* = sqrt((1 - sigma) / kappa) users, retrograde past it.
    ``--models cheap:5,slow:40`` (knee): several models, each under its own name and service time,
    sharing the slots in arrival order, or ``--priority`` models first; ``NAME:MS:SLOTS`` gives a
    model instances of its own (mix.py); on every endpoint (KServe's path, OpenAI's ``model``,
    TorchServe's and TF Serving's paths), each counted per model as that server counts it.
    ``--warmup-s W --warmup-extra-ms X`` (knee and usl): requests take up to X ms more during the
    first W seconds after the first inference request, falling linearly: a warm-up to be cut.
    ``--jitter J`` (knee and usl; jitter.py): each service time times seeded lognormal noise of
    mean 1 and spread J, per request and per ``--jitter-period`` seconds: a noisy server, on which
    the same plan run twice gets other figures (``kneeswarm run --repeat``).
    ``--mode prefork``: a server of several processes (prefork.py): the listener forks
    ``--workers`` single-threaded worker processes that accept on its socket, each request costing
    ``--cpu-ms`` of the worker's CPU; ``--max-requests`` recycles a worker (it exits, the listener
    forks another).  KServe v2 and TorchServe inference endpoints only, no /metrics.

Endpoints (KServe v2 / Open Inference Protocol over HTTP, JSON tensors)
    GET  /v2                                  server metadata
    GET  /v2/health/live, /v2/health/ready    200 when live / ready
    GET  /v2/models/{name}                    model metadata: name, platform, inputs, outputs
    GET  /v2/models/{name}/ready              200 when the model is ready
    POST /v2/models/{name}[/versions/{v}]/infer
         {"inputs": [{"name": "input", "shape": [B, 64], "datatype": "FP32", "data": [...]}]}
         -> {"model_name", "model_version", "id", "outputs": [{"name": "output", "shape", ...}]}
    OpenAI-compatible (llm.py): GET /health, GET /v1/models, POST /v1/chat/completions and
         /v1/completions, streamed (SSE) or not; one engine step per token, first token after
         --ttft-ms, then one every --itl-ms; --output-tokens cuts generation short.  With
         --kv-tokens K a model of an LLM engine serves them instead (llmengine.py): continuous
         batching of --max-batch sequences over a K-token KV cache, --prefill-ms-per-token and
         --decode-ms per step, preemption when the cache is full, vLLM's engine metrics;
         --prefix-cache-blocks N adds its block prefix cache (hit and query counters).  --adapters
         serves LoRA adapters by name, --max-loras of them at once, swapping (lora.py).
    TorchServe and TF Serving (serving.py): GET /ping, POST /predictions/{name}[/{version}],
         GET /v1/models/{name}, POST /v1/models/{name}:predict.
    GET  /metrics                             Prometheus text; names documented in metrics.py:
         kneeswarm_target_requests_total{code}, kneeswarm_target_rejected_total,
         kneeswarm_target_inflight, kneeswarm_target_queue_length,
         kneeswarm_target_request_duration_seconds, kneeswarm_target_queue_wait_seconds,
         kneeswarm_target_inference_duration_seconds, kneeswarm_target_batch_size,
         kneeswarm_target_workers, kneeswarm_target_queue_capacity, kneeswarm_target_info

Errors are JSON ``{"error": "..."}``: 404 for an unknown model or path, 400 for a malformed body,
a wrong input name, shape or datatype, 503 when the bounded queue is full.

Around everything (gate.py): ``--api-key-env NAME`` requires ``Authorization: Bearer $NAME``
(401 otherwise), and fault injection on inference requests, counted on /metrics
(``kneeswarm_target_faults_total{kind}``): ``--fail-rate``, ``--reset-rate``,
``--truncate-rate``, ``--stall-ms``/``--stall-every``.  What arrived is counted too
(``kneeswarm_target_received_*``: protocol, model, items, input shapes; prompt tokens), and with
``--request-log PATH`` every POST body with its arrival time (requestlog.py).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kneeswarm.target import model as model_mod
from kneeswarm.target.engine import KneeEngine, OnnxEngine, Rejected, UslEngine, Warmup
from kneeswarm.target.gate import FaultPlan, Gate
from kneeswarm.target.jitter import DEFAULT_PERIOD_S, Jitter
from kneeswarm.target.llm import DEFAULT_DECODE_MS, DEFAULT_MAX_BATCH, LLMConfig, TokenChain, llm_routes
from kneeswarm.target import lora, prefork
from kneeswarm.target.metrics import PROMETHEUS_CONTENT_TYPE, TargetMetrics
from kneeswarm.target.mix import MixEngine, parse_models
from kneeswarm.target.prefork import DEFAULT_CPU_MS, DEFAULT_WORKERS
from kneeswarm.target.requestlog import RequestLog
from kneeswarm.target.soak import Soak
from kneeswarm.target.serving import serving_routes

logger = logging.getLogger(__name__)

SERVER_NAME = "kneeswarm-target"
SERVER_VERSION = "0.1.0"
MODEL_VERSION = "1"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_MODEL_NAME = "demo"
DEFAULT_MODE = "onnx"
DEFAULT_REQUEST_THREADS = 4
DEFAULT_QUEUE_SIZE = 0  # unbounded
DEFAULT_INTRA_OP_THREADS = 1
DEFAULT_INTER_OP_THREADS = 1
DEFAULT_BATCH_MAX = 1
DEFAULT_BATCH_WAIT_MS = 2.0
DEFAULT_SLOTS = 4
DEFAULT_SERVICE_MS = 50.0
DEFAULT_SIGMA = 0.05  # usl mode: N* = sqrt(0.95 / 0.0025) = 19.5 users
DEFAULT_KAPPA = 0.0025
MAX_ROWS = 1024  # largest batch one infer request may carry
LISTEN_BACKLOG = 2048
GRACEFUL_SHUTDOWN_S = 5
KNEE_OUTPUT = {"name": model_mod.OUTPUT_NAME, "shape": [1, 1], "datatype": "FP32", "data": [0.0]}
LISTENING_LINE = "kneeswarm target listening on {url} mode={mode} pid={pid}"


class BadRequest(ValueError):
    """The infer body is not a valid request for this model: answer 400."""


@dataclass(frozen=True)
class ModelInfo:
    name: str
    platform: str
    input_dim: int
    output_dim: int
    also: tuple[str, ...] = ()  # further models served (--models: each under its own name)

    def metadata(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "versions": [MODEL_VERSION],
            "platform": self.platform,
            "inputs": [
                {"name": model_mod.INPUT_NAME, "datatype": "FP32", "shape": [-1, self.input_dim]}
            ],
            "outputs": [
                {"name": model_mod.OUTPUT_NAME, "datatype": "FP32", "shape": [-1, self.output_dim]}
            ],
        }


# -- request parsing ----------------------------------------------------------------------------
def parse_inputs(body: bytes) -> tuple[dict[str, Any], list[Any]]:
    """The JSON request and its ``inputs`` list, or BadRequest."""
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from None
    if not isinstance(request, dict):
        raise BadRequest("body must be a JSON object with an 'inputs' list")
    inputs = request.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise BadRequest("body must have a non-empty 'inputs' list")
    return request, inputs


def parse_tensor(inputs: list[Any], input_dim: int) -> np.ndarray:
    """The one FP32 [rows, input_dim] input tensor of an onnx-mode request, or BadRequest."""
    if len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise BadRequest(f"expected exactly one input tensor named {model_mod.INPUT_NAME!r}")
    tensor = inputs[0]
    if tensor.get("name") != model_mod.INPUT_NAME:
        raise BadRequest(f"unknown input {tensor.get('name')!r}: expected {model_mod.INPUT_NAME!r}")
    if tensor.get("datatype") != "FP32":
        raise BadRequest(f"input datatype {tensor.get('datatype')!r}: expected 'FP32'")
    shape = tensor.get("shape")
    if (
        not isinstance(shape, list)
        or len(shape) != 2
        or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape)
        or not 1 <= shape[0] <= MAX_ROWS
        or shape[1] != input_dim
    ):
        raise BadRequest(
            f"input shape {shape!r}: expected [B, {input_dim}] with 1 <= B <= {MAX_ROWS}"
        )
    data = tensor.get("data")
    if not isinstance(data, list):
        raise BadRequest("input 'data' must be a list of numbers")
    try:
        array = np.asarray(data, dtype=np.float32)
    except (ValueError, TypeError):
        raise BadRequest("input 'data' must be a flat list of numbers") from None
    if array.size != shape[0] * shape[1]:
        raise BadRequest(
            f"input data has {array.size} elements, shape {shape} needs {shape[0] * shape[1]}"
        )
    if not np.isfinite(array).all():
        raise BadRequest("input data holds NaN or infinity")
    return np.ascontiguousarray(array.reshape(shape))


# -- the application ----------------------------------------------------------------------------
def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def received_inputs(inputs: list[Any]) -> tuple[int, list[tuple[str, str, str]]]:
    """(items: the first input's first dimension, [(name, datatype, "AxB")]) of a KServe request."""
    seen = []
    for t in inputs:
        if isinstance(t, dict):
            shape = given if isinstance(given := t.get("shape"), list) else []
            seen.append((str(t.get("name")), str(t.get("datatype")), "x".join(str(d) for d in shape)))
    first = inputs[0].get("shape") if inputs and isinstance(inputs[0], dict) else None
    items = first[0] if isinstance(first, list) and first and isinstance(first[0], int) else 1
    return items, seen


# One function: the routes share the engine, the ready flag and the metrics (closures).
def build_app(
    info: ModelInfo,
    engine: OnnxEngine | KneeEngine | UslEngine | MixEngine,
    metrics: TargetMetrics,
    on_started: Callable[[], None] | None = None,
    llm: LLMConfig | None = None,
) -> Starlette:
    """The Starlette application serving ``engine`` under KServe v2, OpenAI, TorchServe and TF Serving."""
    ready = False
    is_onnx = isinstance(engine, OnnxEngine)
    served = metrics.requests

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        nonlocal ready
        engine.start()
        ready = True
        if on_started is not None:
            on_started()
        try:
            yield
        finally:
            ready = False
            engine.stop()

    def known(name: str) -> bool:
        return name == info.name or name in info.also

    async def server_metadata(request: Request) -> Response:
        return JSONResponse({"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": []})

    async def live(request: Request) -> Response:
        return JSONResponse({"live": True})

    async def server_ready(request: Request) -> Response:
        return JSONResponse({"ready": ready}, status_code=200 if ready else 503)

    async def model_metadata(request: Request) -> Response:
        name = request.path_params["name"]
        if not known(name):
            return _error(404, f"unknown model {name!r}: this server serves {info.name!r}")
        return JSONResponse(info.metadata())

    async def model_ready(request: Request) -> Response:
        name = request.path_params["name"]
        if not known(name):
            return _error(404, f"unknown model {name!r}: this server serves {info.name!r}")
        return JSONResponse({"name": name, "ready": ready}, status_code=200 if ready else 503)

    async def infer(request: Request) -> Response:
        started = time.perf_counter()
        name = request.path_params["name"]
        try:
            body, inputs = parse_inputs(await request.body())
            metrics.record_received("kserve", name, *received_inputs(inputs))
            if not known(name):
                served.labels(code="404").inc()
                return _error(404, f"unknown model {name!r}: this server serves {info.name!r}")
            if isinstance(engine, OnnxEngine):  # is_onnx, said so mypy knows which infer()
                x = parse_tensor(inputs, info.input_dim)
                output = await engine.infer(x)
                tensor = {
                    "name": model_mod.OUTPUT_NAME,
                    "shape": list(output.shape),
                    "datatype": "FP32",
                    "data": output.ravel().tolist(),
                }
            else:
                await (engine.infer(name) if isinstance(engine, MixEngine) else engine.infer())
                tensor = KNEE_OUTPUT
        except BadRequest as exc:
            served.labels(code="400").inc()
            metrics.nv_failure.labels(model=name, reason="REJECTED", version=MODEL_VERSION).inc()
            return _error(400, str(exc))
        except Rejected as exc:
            metrics.rejected.inc()
            served.labels(code="503").inc()
            return _error(503, str(exc))
        except Exception as exc:
            logger.exception("infer failed")
            served.labels(code="500").inc()
            return _error(500, f"inference failed: {exc}")
        m = metrics.triton(name)  # Triton's counters of the model asked for
        m.success.inc()
        m.count.inc(received_inputs(inputs)[0])
        m.request_us.inc((time.perf_counter() - started) * 1e6)
        request_id = body.get("id")
        response = JSONResponse(
            {
                "model_name": name,
                "model_version": MODEL_VERSION,
                "id": request_id if isinstance(request_id, str) else uuid.uuid4().hex,
                "outputs": [tensor],
            }
        )
        served.labels(code="200").inc()
        metrics.request_duration.observe(time.perf_counter() - started)
        return response

    async def prometheus(request: Request) -> Response:
        return Response(metrics.render(), media_type=PROMETHEUS_CONTENT_TYPE)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return _error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")

    routes = [
        Route("/v2", server_metadata),
        Route("/v2/health/live", live),
        Route("/v2/health/ready", server_ready),
        Route("/v2/models/{name}", model_metadata),
        Route("/v2/models/{name}/versions/{version}", model_metadata),
        Route("/v2/models/{name}/ready", model_ready),
        Route("/v2/models/{name}/versions/{version}/ready", model_ready),
        Route("/v2/models/{name}/infer", infer, methods=["POST"]),
        Route("/v2/models/{name}/versions/{version}/infer", infer, methods=["POST"]),
        Route("/metrics", prometheus),
        *llm_routes(info.name, TokenChain(engine if is_onnx else None, info.input_dim), metrics,
                    llm or LLMConfig(), lambda: ready, info.also, engine if isinstance(engine, MixEngine) else None),
        *serving_routes(info.name, engine, is_onnx, info.input_dim, metrics, lambda: ready, info.also),
    ]
    return Starlette(
        routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error}
    )


# -- command line -------------------------------------------------------------------------------
def _int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below the minimum {minimum}")
        return value

    return parse


def _non_negative(zero_ok: bool) -> Callable[[str], float]:
    """An argparse type: a finite number above zero (or zero too, when ``zero_ok``)."""
    what = "zero or a positive number" if zero_ok else "a positive number"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        ok = value >= 0 if zero_ok else value > 0
        if not ok or value == float("inf"):
            raise argparse.ArgumentTypeError(f"{value} must be {what}")
        return value

    return parse


_positive_float = _non_negative(zero_ok=False)
_non_negative_float = _non_negative(zero_ok=True)


def _kv_tokens(text: str) -> int:
    """An argparse type: 0 (no engine model) or a KV cache of at least 2 tokens."""
    value = _int_at_least(0)(text)
    if value == 1:
        raise argparse.ArgumentTypeError("1 must be 0 (no engine model) or at least 2")
    return value


def _models(text: str) -> list[Any]:
    try:
        return parse_models(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _rate(text: str) -> float:
    """An argparse type: a probability in [0, 1]."""
    value = _non_negative_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{value} must be between 0 and 1")
    return value


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (and exit 2, as argparse's do)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


# One flat list of flags, grouped as --help shows them: splitting it would only scatter them.
def build_parser(prog: str = "kneeswarm target") -> argparse.ArgumentParser:
    p = _Parser(
        prog=prog,
        description=(
            "Bundled demo inference server (KServe v2, OpenAI-compatible with streaming, TorchServe, "
            "TF Serving over HTTP, Prometheus /metrics) to find the knee of. Prints 'kneeswarm target listening on URL mode=MODE pid=PID' as its first "
            "stdout line; stops cleanly on SIGTERM or SIGINT."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--mode", choices=["onnx", "knee", "usl", "prefork"], default=DEFAULT_MODE,
                   help="onnx: real ONNX Runtime inference of a generated MLP; knee: ground truth, "
                        "--slots requests at once, each for --service-ms, no CPU work; usl: ground truth, "
                        "every request at once for --service-ms x (1 + sigma(N-1) + kappa N(N-1)), N in service; "
                        "prefork: --workers single-threaded processes behind one port, --cpu-ms of CPU per request")
    p.add_argument("--host", default=DEFAULT_HOST, help="address to bind")
    p.add_argument("--port", type=_int_at_least(0), default=DEFAULT_PORT,
                   help="port to bind; 0 picks a free one (see the first stdout line)")
    p.add_argument("--model-name", default=DEFAULT_MODEL_NAME,
                   help="name the model is served under")
    p.add_argument("--queue-size", type=_int_at_least(0), default=DEFAULT_QUEUE_SIZE,
                   help="bound on requests waiting for a request thread (onnx) or slot (knee); "
                        "beyond it requests get 503 and count in kneeswarm_target_rejected_total; "
                        "0 = unbounded")
    p.add_argument("--log-level", default="warning",
                   choices=["debug", "info", "warning", "error", "critical"], help="log level")

    onnx = p.add_argument_group("onnx mode")
    onnx.add_argument("--request-threads", type=_int_at_least(1), default=DEFAULT_REQUEST_THREADS,
                      help="application worker threads running inference (all share one session)")
    onnx.add_argument("--intra-op-threads", type=_int_at_least(0), default=DEFAULT_INTRA_OP_THREADS,
                      help="ONNX Runtime intra_op_num_threads per run; 0 = ONNX Runtime's default "
                           "(all physical cores)")
    onnx.add_argument("--inter-op-threads", type=_int_at_least(0), default=DEFAULT_INTER_OP_THREADS,
                      help="ONNX Runtime inter_op_num_threads; 0 = ONNX Runtime's default")
    onnx.add_argument("--batch-max", type=_int_at_least(1), default=DEFAULT_BATCH_MAX,
                      help="micro-batching: run up to this many queued requests as one batch "
                           "(1 = off)")
    onnx.add_argument("--batch-wait-ms", type=_non_negative_float, default=DEFAULT_BATCH_WAIT_MS,
                      help="micro-batching: longest wait after the oldest queued request for a "
                           "batch to fill")
    onnx.add_argument("--model-copy-per-request", action="store_true",
                      help="run each concurrent request on a model copy of its own, from a pool that opens "
                           "one more session whenever none is free (memory grows with the concurrency)")
    onnx.add_argument("--work", type=_int_at_least(1), default=model_mod.DEFAULT_LAYERS,
                      help="cost of one inference: number of hidden layers (time grows linearly)")
    onnx.add_argument("--hidden", type=_int_at_least(1), default=model_mod.DEFAULT_HIDDEN,
                      help="hidden width of the MLP (time grows with its square)")
    onnx.add_argument("--tokens", type=_int_at_least(1), default=model_mod.DEFAULT_TOKENS,
                      help="rows each input is expanded to inside the model (like a sequence "
                           "length; time grows linearly)")
    onnx.add_argument("--input-dim", type=_int_at_least(1), default=model_mod.DEFAULT_INPUT_DIM,
                      help="input width D: requests carry shape [B, D]")
    onnx.add_argument("--output-dim", type=_int_at_least(1), default=model_mod.DEFAULT_OUTPUT_DIM,
                      help="output width: responses carry shape [B, output-dim]")
    onnx.add_argument("--seed", type=int, default=model_mod.DEFAULT_SEED,
                      help="seed of the weights")

    llm = p.add_argument_group("OpenAI-compatible endpoints (/v1/chat/completions, /v1/completions)")
    llm.add_argument("--ttft-ms", type=_non_negative_float, default=0.0,
                     help="the first text token leaves this long after the request arrived")
    llm.add_argument("--itl-ms", type=_non_negative_float, default=0.0,
                     help="each later token leaves this long after the one before")
    llm.add_argument("--output-tokens", type=_int_at_least(0), default=0,
                     help="tokens generated before the end of sequence (0 = always max_tokens; "
                          "ignore_eos in the request overrides it)")
    llm.add_argument("--usage-offset", type=int, default=0,
                     help="usage.completion_tokens says this many tokens more than were produced "
                          "(a server whose own count disagrees with its stream)")
    llm.add_argument("--tokens-per-chunk", type=_int_at_least(1), default=1,
                     help="stream N tokens merged into each chunk, sent when its last token is released "
                          "(a server that detokenizes incrementally); usage still counts tokens")
    llm.add_argument("--no-text-every", type=_int_at_least(0), default=0, metavar="K",
                     help="every K-th streamed answer sends its tokens in chunks with empty text "
                          "(usage still counts them): a stream with no first token to time (0 = never)")

    model = p.add_argument_group(
        "LLM engine model behind the OpenAI endpoints (on with --kv-tokens; known delays, no CPU; "
        "replaces --ttft-ms/--itl-ms): continuous batching over a KV cache, preemption when it is full")
    model.add_argument("--kv-tokens", type=_kv_tokens, default=0,
                       help="KV-cache capacity in tokens (0 = no engine model)")
    model.add_argument("--max-batch", type=_int_at_least(1), default=DEFAULT_MAX_BATCH,
                       help="sequences decoded together at most (vLLM max_num_seqs)")
    model.add_argument("--prefill-ms-per-token", type=_non_negative_float, default=0.0,
                       help="time one engine step spends per prompt token it prefills (or recomputes)")
    model.add_argument("--decode-ms", type=_positive_float, default=DEFAULT_DECODE_MS,
                       help="time of one engine step: every running sequence produces one token")
    model.add_argument("--decode-ms-per-seq", type=_non_negative_float, default=0.0,
                       help="added to each step per sequence in the batch (a decode step that grows with "
                            "the batch, as a memory-bound GPU's does)")

    model.add_argument("--prefix-cache-blocks", type=_int_at_least(0), default=0, metavar="N",
                       help="the engine model's prefix cache: N blocks of 16 tokens, least recently used out "
                            "(0 = no prefix caching)")

    lora.add_arguments(p)
    gate = p.add_argument_group("credentials and fault injection (inference requests)")
    gate.add_argument("--api-key-env", metavar="NAME",
                      help="require 'Authorization: Bearer $NAME' on every request but health and "
                           "metrics (401 otherwise)")
    gate.add_argument("--fail-rate", type=_rate, default=0.0, help="share of requests answered 500")
    gate.add_argument("--reset-rate", type=_rate, default=0.0,
                      help="share of requests whose connection is reset (TCP RST, no answer)")
    gate.add_argument("--truncate-rate", type=_rate, default=0.0,
                      help="share of streamed answers cut off mid-stream (no [DONE])")
    gate.add_argument("--stall-ms", type=_non_negative_float, default=0.0,
                      help="length of each stall window: requests arriving in it wait for its end")
    gate.add_argument("--stall-every", type=_non_negative_float, default=0.0,
                      help="seconds between the starts of stall windows (0 = no stalls)")
    gate.add_argument("--fail-above", type=int, default=0, metavar="N",
                      help="answer 500 to an inference request that arrives with more than N in service "
                           "(itself included): a service that fails above N concurrent; 0 = never")
    gate.add_argument("--fault-seed", type=int, default=0, help="seed of the fault draws")
    gate.add_argument("--write-kb", type=_int_at_least(0), default=0, metavar="N",
                      help="append N KiB to --write-file and fsync it before each inference request (disk IO)")
    gate.add_argument("--write-file", metavar="PATH", help="the file --write-kb writes")
    gate.add_argument("--cpu-work-per-inflight", type=_int_at_least(0), default=0, metavar="K",
                      help="CPU work per inference request: K units (~0.4 ms) x the requests in flight")
    gate.add_argument("--spin-wait", type=_int_at_least(0), default=0, metavar="K",
                      help="let at most K inference requests through at once; the others wait by spinning on a "
                           "lock with sched_yield() (threads fighting over a lock); 0 = off")
    gate.add_argument("--request-log", metavar="PATH",
                      help="append one JSON line per POST request: arrival time, path, body (requestlog.py)")

    knee = p.add_argument_group("knee mode")
    knee.add_argument("--slots", type=_int_at_least(1), default=DEFAULT_SLOTS,
                      help="requests served at once (the knee, in users)")
    knee.add_argument("--models", type=_models, default=None, metavar="NAME:MS[:SLOTS],...",
                      help="several models, each served under its name for MS ms; sharing --slots (FIFO), or "
                           "SLOTS instances of its own (kneeswarm.target.mix)")
    knee.add_argument("--priority", type=lambda t: [n for n in t.split(",") if n], default=[], metavar="NAME,...",
                      help="--models: the shared queue serves these models first (the others starve)")
    knee.add_argument("--service-ms", type=_positive_float, default=DEFAULT_SERVICE_MS,
                      help="time each request holds its slot (usl mode: T, the time of a request alone)")
    usl = p.add_argument_group("usl mode (and --service-ms)")
    usl.add_argument("--sigma", type=_rate, default=DEFAULT_SIGMA,
                     help="contention: each other request in service adds this share of --service-ms")
    usl.add_argument("--kappa", type=_rate, default=DEFAULT_KAPPA,
                     help="coherency: N(N-1) pairs in service add this share each; peak at sqrt((1-sigma)/kappa)")
    soak = p.add_argument_group("soak faults (inference requests; kneeswarm.target.soak)")
    soak.add_argument("--leak-kb-per-request", type=_non_negative_float, default=0.0, metavar="KB",
                      help="keep this many kB per request for the life of the process (RSS grows by KB x QPS)")
    soak.add_argument("--drift-ms-per-min", type=_non_negative_float, default=0.0, metavar="MS",
                      help="hold each request this many ms longer per minute since the first inference request")
    soak.add_argument("--leak-fd-every", type=_int_at_least(0), default=0, metavar="N",
                      help="open /dev/null and never close it, once every N inference requests (fds grow)")
    soak.add_argument("--leak-thread-every", type=_int_at_least(0), default=0, metavar="N",
                      help="start a thread that never ends, once every N inference requests (threads grow)")
    prefork = p.add_argument_group("prefork mode (kneeswarm.target.prefork)")
    prefork.add_argument("--workers", type=_int_at_least(1), default=DEFAULT_WORKERS,
                         help="worker processes forked by the listener, one request at a time each")
    prefork.add_argument("--cpu-ms", type=_positive_float, default=DEFAULT_CPU_MS,
                         help="CPU time each inference request costs its worker (real hashing, not a sleep)")
    prefork.add_argument("--max-requests", type=_int_at_least(0), default=0,
                         help="a worker exits after this many inference requests and the listener forks "
                              "another (gunicorn's max_requests); 0 = never")
    drift = p.add_argument_group("latency drift (knee and usl modes)")
    drift.add_argument("--warmup-s", type=_non_negative_float, default=0.0,
                       help="seconds, from the first inference request, over which the extra time falls to 0")
    drift.add_argument("--warmup-extra-ms", type=_non_negative_float, default=0.0,
                       help="extra time of the first request (falls linearly to 0 over --warmup-s)")
    noise = p.add_argument_group("noise (knee and usl modes; kneeswarm.target.jitter)")
    noise.add_argument("--jitter", type=_non_negative_float, default=0.0, metavar="J",
                       help="each service time times two lognormal factors of mean 1 and spread J (sigma of "
                            "the log): one per request, one per --jitter-period; 0 = exact times")
    noise.add_argument("--jitter-period", type=_non_negative_float, default=DEFAULT_PERIOD_S, metavar="SECONDS",
                       help="how long the slow factor holds (a noisy neighbour); 0 = per-request noise only")
    noise.add_argument("--jitter-seed", type=int, default=0, help="seed of the noise")
    return p


def _bind(host: str, port: int) -> socket.socket:
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on sockets that say they are TCP,
    # and without it a response's headers and body (two writes) meet the client's delayed ACK,
    # adding ~40 ms to every request.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind((host, port))
    sock.listen(LISTEN_BACKLOG)
    sock.set_inheritable(True)
    return sock


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _jitter(args: argparse.Namespace, info_labels: dict[str, Any]) -> Jitter:
    """--jitter's noise (its settings added to the info metric's labels when on)."""
    if args.jitter:
        info_labels.update(jitter=args.jitter, jitter_period=args.jitter_period, jitter_seed=args.jitter_seed)
    return Jitter(args.jitter, args.jitter_period, args.jitter_seed)


def _build_mix(args: argparse.Namespace, info_labels: dict[str, Any], warmup: Warmup,
               jitter: Jitter) -> tuple[ModelInfo, MixEngine, TargetMetrics]:
    """``--models``: the models of different cost of kneeswarm.target.mix, behind one server."""
    info_labels.update(model=args.models[0].name, slots=args.slots, priority=",".join(args.priority),
                       models=",".join(f"{m.name}:{m.service_ms:g}" for m in args.models))
    metrics = TargetMetrics(info_labels, workers=args.slots, queue_capacity=args.queue_size)
    engine = MixEngine(metrics, args.models, args.slots, tuple(args.priority), args.queue_size, warmup, jitter)
    names = tuple(m.name for m in args.models)
    return ModelInfo(names[0], "kneeswarm_knee", -1, 1, also=names[1:]), engine, metrics


def _build(args: argparse.Namespace) -> tuple[ModelInfo, OnnxEngine | KneeEngine | UslEngine | MixEngine, TargetMetrics]:
    info_labels: dict[str, Any] = {"mode": args.mode, "model": args.model_name}
    warmup, jitter = Warmup(args.warmup_s, args.warmup_extra_ms / 1000.0), _jitter(args, info_labels)
    if args.mode == "usl":
        info_labels.update(service_ms=args.service_ms, sigma=args.sigma, kappa=args.kappa)
        metrics = TargetMetrics(info_labels, workers=0, queue_capacity=0)
        engine: OnnxEngine | KneeEngine | UslEngine | MixEngine = UslEngine(
            metrics, service_s=args.service_ms / 1000.0, sigma=args.sigma, kappa=args.kappa, warmup=warmup,
            jitter=jitter)
        return ModelInfo(args.model_name, "kneeswarm_usl", -1, 1), engine, metrics  # any input
    if args.mode == "knee" and args.models:  # several models of different cost (mix.py)
        return _build_mix(args, info_labels, warmup, jitter)
    if args.mode == "knee":
        info_labels.update(slots=args.slots, service_ms=args.service_ms)
        metrics = TargetMetrics(info_labels, workers=args.slots, queue_capacity=args.queue_size)
        engine = KneeEngine(metrics, slots=args.slots, service_s=args.service_ms / 1000.0, queue_size=args.queue_size,
                            warmup=warmup, jitter=jitter)
        return ModelInfo(args.model_name, "kneeswarm_knee", -1, 1), engine, metrics  # any input
    spec = model_mod.ModelSpec(
        input_dim=args.input_dim,
        tokens=args.tokens,
        hidden=args.hidden,
        layers=args.work,
        output_dim=args.output_dim,
        seed=args.seed,
    )
    info_labels.update(
        request_threads=args.request_threads,
        intra_op_threads=args.intra_op_threads,
        inter_op_threads=args.inter_op_threads,
        batch_max=args.batch_max,
        batch_wait_ms=args.batch_wait_ms,
        work=args.work,
        hidden=args.hidden,
        tokens=args.tokens,
        parameters=spec.parameters,
    )
    model = model_mod.build_mlp(spec)
    session = model_mod.make_session(model, args.intra_op_threads, args.inter_op_threads)
    copy = (lambda: model_mod.make_session(model, args.intra_op_threads, args.inter_op_threads)) \
        if args.model_copy_per_request else None
    metrics = TargetMetrics(
        info_labels, workers=args.request_threads, queue_capacity=args.queue_size
    )
    engine = OnnxEngine(
        session,
        metrics,
        request_threads=args.request_threads,
        queue_size=args.queue_size,
        batch_max=args.batch_max,
        batch_wait_s=args.batch_wait_ms / 1000.0,
        make_session=copy,
    )
    info = ModelInfo(args.model_name, "onnxruntime_onnx", args.input_dim, args.output_dim)
    return info, engine, metrics


def _exit_quietly(signum: int, frame: Any) -> None:
    """uvicorn re-raises the signal that stopped it once it has shut down; by then we are done."""


def _wrapped_app(args: argparse.Namespace, info: ModelInfo, engine: OnnxEngine | KneeEngine | UslEngine | MixEngine, metrics: TargetMetrics,
                 announce: Callable[[], None]) -> Any:
    """The application inside the gate (API key, faults), inside the request log when asked
    (ValueError: a bad gate setting; OSError: the log cannot be opened)."""
    llm = LLMConfig(ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, output_tokens=args.output_tokens,
                    usage_offset=args.usage_offset, tokens_per_chunk=args.tokens_per_chunk,
                    no_text_every=args.no_text_every, kv_tokens=args.kv_tokens, max_batch=args.max_batch,
                    prefill_ms_per_token=args.prefill_ms_per_token, decode_ms=args.decode_ms,
                    decode_ms_per_seq=args.decode_ms_per_seq)
    llm = dataclasses.replace(llm, prefix_cache_blocks=args.prefix_cache_blocks,  # the prefix cache (LLM workloads)
                              adapters=args.adapters, max_loras=args.max_loras, swap_ms=args.swap_ms)  # LoRA (lora.py)
    faults = FaultPlan(fail_rate=args.fail_rate, reset_rate=args.reset_rate, truncate_rate=args.truncate_rate,
                       stall_ms=args.stall_ms, stall_every=args.stall_every, seed=args.fault_seed,
                       fail_above=args.fail_above,
                       write_kb=args.write_kb, write_file=args.write_file,
                       cpu_work_per_inflight=args.cpu_work_per_inflight, spin_wait=args.spin_wait)
    inner: Any = build_app(info, engine, metrics, on_started=announce, llm=llm)
    if args.leak_kb_per_request or args.drift_ms_per_min or args.leak_fd_every or args.leak_thread_every:
        inner = Soak(inner, args.leak_kb_per_request, args.drift_ms_per_min, args.leak_fd_every, args.leak_thread_every)
    app: Any = Gate(inner, metrics, faults, api_key_env=args.api_key_env)
    return RequestLog(app, args.request_log) if args.request_log else app


def _serve_prefork(args: argparse.Namespace, sock: socket.socket) -> int:
    """``--mode prefork``: the listener and its workers on ``sock`` (prefork.py) until stopped."""
    url = _url(sock)

    def forked() -> None:
        print(LISTENING_LINE.format(url=url, mode=args.mode, pid=os.getpid()), flush=True)

    return prefork.serve(sock, args.workers, args.model_name, args.cpu_ms, args.max_requests, forked)


def _check_models(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if (args.models or args.priority) and (args.mode != "knee" or not set(args.priority) <= {m.name for m in args.models or []}):
        parser.error("--models is for --mode knee, and --priority names some of its models")
    if args.models and args.kv_tokens:  # the OpenAI endpoints are the engine model's, which has no models of its own
        parser.error("--models and --kv-tokens: one or the other (the engine model serves one model)")
    if args.adapters and (args.kv_tokens or args.model_name in args.adapters):
        parser.error("--adapters: served on the --ttft-ms/--itl-ms schedule (not --kv-tokens), none named as the model")


def main(argv: list[str] | None = None) -> int:
    """Run the demo target until SIGTERM/SIGINT; 0 on a clean stop, 2 on bad arguments."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_models(parser, args)
    if args.jitter and args.mode == "onnx":  # the onnx mode's time is real work: no service time to scale
        parser.error("--jitter is for --mode knee and usl (their service time is set, not measured)")
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        sock = _bind(args.host, args.port)
    except OSError as exc:
        where = f"{args.host}:{args.port}"
        print(f"kneeswarm target: cannot listen on {where}: {exc.strerror or exc}", file=sys.stderr)
        return 1

    if args.mode == "prefork":  # no engine, no uvicorn: processes of its own (prefork.py)
        return _serve_prefork(args, sock)

    import uvicorn  # imported late: --help and bad arguments stay fast

    try:
        info, engine, metrics = _build(args)
    except Exception as exc:  # onnx/onnxruntime failures: one line, not a traceback
        sock.close()
        print(f"kneeswarm target: cannot build the {args.mode} engine: {exc}", file=sys.stderr)
        return 1
    url = _url(sock)

    def announce() -> None:
        # Printed once the engine has started and just before uvicorn serves the bound socket;
        # connections made right after are held in the listen backlog, never refused.
        print(LISTENING_LINE.format(url=url, mode=args.mode, pid=os.getpid()), flush=True)
        logger.info("serving model %r in %s mode at %s", info.name, args.mode, url)

    try:
        app = _wrapped_app(args, info, engine, metrics, announce)
    except (ValueError, OSError) as exc:
        sock.close()
        print(f"kneeswarm target: {exc}", file=sys.stderr)
        return 2
    config = uvicorn.Config(
        app,
        log_level=args.log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        server_header=False,
    )
    server = uvicorn.Server(config)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _exit_quietly)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0 if server.started else 1

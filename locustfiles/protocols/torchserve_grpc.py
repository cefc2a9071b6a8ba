"""TorchServe's gRPC inference API: ``org.pytorch.serve.grpc.inference.InferenceAPIsService``.

``Predictions`` (unary), or ``StreamPredictions`` (``[request] rpc = "StreamPredictions"``: the
server streams the intermediate answers a handler sends with ``send_intermediate_predict_response``,
then the last; TTFT, ITL and tokens as the other streams count them, one token per answer with
content unless the plan has a tokenizer).  The request's ``input`` map carries one entry, ``data``:
the same JSON document the ``torchserve`` protocol POSTs over HTTP (``{"data": <nested list of
shape>}``), so a handler that reads the HTTP body reads this one.  An answer is valid when its
``prediction`` is not empty (a handler may answer anything).

Preflight: ``Ping`` must say Healthy, then one real prediction: an unknown model is TorchServe's
NOT_FOUND (its management API, another port, is often not reachable from the load machine).
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from kneeswarm.contracts.grpcapi.torchserve import inference_pb2 as pb
from kneeswarm.contracts.plan import EndpointPlan
from kneeswarm.locustfiles.protocols.base import (BODY_VARIANTS, BadPayload, PreflightError, PreparedRequest,
                                                  ProtocolError, Tokens)
from kneeswarm.locustfiles.protocols.grpcbase import Target, channel, failure, retrying
from kneeswarm.locustfiles.protocols.grpctensors import GrpcProtocol
from kneeswarm.locustfiles.protocols.tensors import batched, nested, values
from kneeswarm.locustfiles.protocols.triton_stream import ResponseStream

logger = logging.getLogger(__name__)

SERVICE = "org.pytorch.serve.grpc.inference.InferenceAPIsService"
RPCS = ("Predictions", "StreamPredictions")


class TorchServeGrpc(GrpcProtocol):
    name = "torchserve-grpc"
    response_type = pb.PredictionResponse
    health_path = f"/{SERVICE}/Ping"

    def __init__(self, request_cfg: dict, seed: int = 0, endpoint: EndpointPlan | None = None):
        super().__init__(request_cfg, seed, endpoint)
        rpc = str(request_cfg.get("rpc") or "Predictions")
        if rpc not in RPCS:
            raise ProtocolError(f"request.rpc for torchserve-grpc is one of {', '.join(RPCS)}, got {rpc!r}")
        self.streaming = rpc == "StreamPredictions"
        self.kind = "unary_stream" if self.streaming else "unary"
        self.path = f"/{SERVICE}/{rpc}"
        self.model = str(request_cfg.get("model", "demo"))
        self.version = str(request_cfg.get("version") or "")
        self.batch = int(request_cfg.get("batch", 1) or 1)
        shape = batched(list(request_cfg.get("shape", [1, 64])), self.batch)
        dtype = str(request_cfg.get("datatype", "FP32"))
        fixed = request_cfg.get("data", "random") == "fixed"
        self._requests = []
        for _ in range(1 if fixed else BODY_VARIANTS):
            doc = json.dumps({"data": nested(values(self._rng, dtype, math.prod(shape), fixed), shape)},
                             separators=(",", ":")).encode()
            msg = pb.PredictionsRequest(model_name=self.model, model_version=self.version, input={"data": doc})
            self._requests.append(PreparedRequest("grpc", self.path, msg.SerializeToString(), self.headers,
                                                  stream=self.streaming, items=self.batch))
        self._i = 0

    def check_message(self, msg: Any) -> Tokens | None:
        if not msg.prediction.strip():
            raise BadPayload("empty prediction")
        return None

    def new_stream(self, t0: float) -> ResponseStream:
        return ResponseStream(t0, self.counter.count if self.cfg.get("tokenizer") else None)

    def feed(self, stream: ResponseStream, msg: Any, now: float) -> None:
        """One streamed PredictionResponse: its prediction is the text of this answer."""
        stream.responses += 1
        if msg.HasField("status") and msg.status.code:
            raise BadPayload(f"stream answer {stream.responses} is an error: {msg.status.message[:120]}")
        stream.text(msg.prediction, now)

    def server_stream_ended(self, stream: ResponseStream) -> None:
        """A server stream's end is its last answer: TorchServe closes it after the handler's last."""
        stream.done = True

    # -- before the load -----------------------------------------------------------------
    def preflight(self, base_url: str, timeout: float = 10.0) -> None:
        import grpc
        from google.protobuf import empty_pb2

        target = Target(base_url)
        with channel(target, self.endpoint, self.headers) as ch:
            ping = ch.unary_unary(f"/{SERVICE}/Ping", request_serializer=empty_pb2.Empty.SerializeToString,
                                  response_deserializer=pb.TorchServeHealthResponse.FromString)
            health = retrying(target, lambda: ping(empty_pb2.Empty(), timeout=min(timeout, 5.0),
                                                   metadata=self.metadata), timeout, self.redact)
            if "healthy" not in health.health.lower() or "unhealthy" in health.health.lower():
                raise PreflightError(f"target {target.url}: TorchServe says {' '.join(health.health.split())[:120]} (Ping)")
            try:
                self._probe(target, ch)
            except grpc.RpcError as raw:
                e = failure(raw)
                said = " ".join(e.details.split())[:160]
                if e.code == "NOT_FOUND" or "not found" in said.lower():
                    raise PreflightError(self.redact(f"model {self.model!r} is not served at {target.url} "
                                                     f"({e.code}: {said})")) from None
                raise PreflightError(self.redact(f"target {target.url}: {self.path}: {e.code}: {said}")) from None

    def _probe(self, target: Target, ch: Any) -> None:
        req = self.next_request()
        try:
            if self.streaming:
                call = ch.unary_stream(self.path, request_serializer=None, response_deserializer=pb.PredictionResponse.FromString)
                stream = self.new_stream(0.0)
                for i, msg in enumerate(call(req.body, timeout=self.timeout, metadata=self.metadata)):
                    self.feed(stream, msg, float(i))
                if not stream.chunks:
                    raise BadPayload("the stream ended without an answer")
            else:
                call = ch.unary_unary(self.path, request_serializer=None, response_deserializer=pb.PredictionResponse.FromString)
                self.check_message(call(req.body, timeout=self.timeout, metadata=self.metadata))
        except BadPayload as e:
            raise PreflightError(self.redact(f"target {target.url}: {self.path} answered OK but {e}")) from None

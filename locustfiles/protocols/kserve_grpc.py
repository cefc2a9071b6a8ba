"""KServe v2 / Open Inference Protocol over gRPC: ``inference.GRPCInferenceService/ModelInfer``.

The same ``[request]`` keys as ``kserve`` (model, version, shape, datatype, data, batch, inputs,
input_name); tensors go as ``raw_input_contents``, or typed with ``contents = "typed"`` (grpctensors.py).  An answer is judged as
``kserve`` judges one: outputs present, each with a shape, and its data there -- a raw content per
output, whose size is what the shape holds for a fixed-size datatype.

Preflight through the server's own gRPC API before any load: ``ServerReady``, ``ModelReady`` (the
plan's model and version), ``ModelMetadata`` (every input the plan sends is one the model declares,
with its datatype, and a shape the model's admits: -1 matches any size), then one real request,
judged as the load will judge it.  Triton, KServe's model server and TorchServe serve this service;
Triton's stubs send it (kneeswarm.contracts.grpcapi: its messages are KServe v2's).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from kneeswarm.contracts.grpcapi.triton import grpc_service_pb2 as pb
from kneeswarm.contracts.plan import EndpointPlan
from kneeswarm.locustfiles.protocols.base import BODY_VARIANTS, BadPayload, PreflightError, PreparedRequest, Tokens
from kneeswarm.locustfiles.protocols.grpcbase import GrpcFailure, Target, channel, failure, retrying
from kneeswarm.locustfiles.protocols.grpctensors import ITEM_SIZE, GrpcProtocol, raw_tensor, typed_contents

logger = logging.getLogger(__name__)

SERVICE = "inference.GRPCInferenceService"


class KServeGrpc(GrpcProtocol):
    name = "kserve-grpc"
    kind = "unary"
    path = f"/{SERVICE}/ModelInfer"
    response_type: Any = pb.ModelInferResponse
    health_path = f"/{SERVICE}/ServerReady"

    def __init__(self, request_cfg: dict, seed: int = 0, endpoint: EndpointPlan | None = None):
        super().__init__(request_cfg, seed, endpoint)
        self.model = str(request_cfg.get("model", "demo"))
        self.version = str(request_cfg.get("version") or "")
        self.batch = int(request_cfg.get("batch", 1) or 1)
        fixed = request_cfg.get("data", "random") == "fixed"
        self._requests = [self._prepared(fixed) for _ in range(1 if fixed else BODY_VARIANTS)]
        self._i = 0

    def message(self, fixed: bool) -> tuple[Any, int | None]:
        """One ModelInferRequest of the plan's tensors, and its prompt's tokens (when it has one)."""
        specs, flats, tokens_in = self.tensors(fixed)
        tensor = pb.ModelInferRequest.InferInputTensor
        if self.cfg.get("contents") == "typed":
            inputs = [tensor(**s, contents=pb.InferTensorContents(**typed_contents(s["datatype"], f)))
                      for s, f in zip(specs, flats)]
            return pb.ModelInferRequest(model_name=self.model, model_version=self.version, inputs=inputs), tokens_in
        return pb.ModelInferRequest(model_name=self.model, model_version=self.version,
                                    inputs=[tensor(**s) for s in specs],
                                    raw_input_contents=[raw_tensor(s["datatype"], f) for s, f in zip(specs, flats)]), tokens_in

    def _prepared(self, fixed: bool) -> PreparedRequest:
        msg, tokens_in = self.message(fixed)
        return PreparedRequest("grpc", self.path, msg.SerializeToString(), self.headers, tokens_in=tokens_in,
                               items=self.batch)

    def check_message(self, msg: Any) -> Tokens | None:
        outputs = msg.outputs
        if not outputs:
            raise BadPayload("answer has no outputs")
        raw = msg.raw_output_contents
        if raw and len(raw) != len(outputs):
            raise BadPayload(f"answer has {len(outputs)} outputs but {len(raw)} raw contents")
        for i, out in enumerate(outputs):
            if not out.shape:
                raise BadPayload(f"output {out.name!r} has no shape")
            if raw:
                size = ITEM_SIZE.get(out.datatype)
                if size is not None and len(raw[i]) != size * math.prod(out.shape):
                    raise BadPayload(f"output {out.name!r}: {len(raw[i])} bytes for shape {list(out.shape)} "
                                     f"of {out.datatype}")
            elif not out.HasField("contents"):
                raise BadPayload(f"output {out.name!r} has no data")
        return None

    # -- before the load -----------------------------------------------------------------
    def preflight(self, base_url: str, timeout: float = 10.0) -> None:
        """ServerReady, ModelReady, ModelMetadata against the plan, one real request (PreflightError)."""
        import grpc

        target = Target(base_url)
        with channel(target, self.endpoint, self.headers) as ch:
            def unary(method: str, request: Any, response: Any) -> Any:
                call = ch.unary_unary(f"/{SERVICE}/{method}", request_serializer=type(request).SerializeToString,
                                      response_deserializer=response.FromString)
                return call(request, timeout=min(timeout, 5.0), metadata=self.metadata)

            ready = retrying(target, lambda: unary("ServerReady", pb.ServerReadyRequest(), pb.ServerReadyResponse),
                             timeout, self.redact)
            if not ready.ready:
                raise PreflightError(f"target {target.url}: the server says it is not ready (ServerReady)")
            try:
                self._check_model(target, unary)
                self.probe_grpc(target, ch)
            except grpc.RpcError as raw:
                raise PreflightError(self.redact(self._said(target, failure(raw)))) from None

    def _said(self, target: Target, e: GrpcFailure) -> str:
        what = f"model {self.model!r}" + (f" version {self.version}" if self.version else "")
        low = e.details.lower()
        if e.code == "NOT_FOUND" or any(w in low for w in ("not found", "does not exist", "unknown model")):
            return f"{what} is not served at {target.url} ({e.code}: {' '.join(e.details.split())[:160]})"
        return f"target {target.url}: {what}: {e.code}: {' '.join(e.details.split())[:160]}"

    def _check_model(self, target: Target, unary: Any) -> None:
        what = f"model {self.model!r}" + (f" version {self.version}" if self.version else "")
        meta = unary("ModelMetadata", pb.ModelMetadataRequest(name=self.model, version=self.version),
                     pb.ModelMetadataResponse)
        declared = {t.name: t for t in meta.inputs}
        for spec in self.input_specs() if declared else ():  # a model that declares no inputs: nothing to check
            t = declared.get(spec["name"])
            if t is None:
                raise PreflightError(f"{what} has no input {spec['name']!r} (it declares: "
                                     f"{', '.join(sorted(declared)) or 'none'}; request.inputs / request.input_name)")
            if t.datatype and t.datatype != spec["datatype"]:
                raise PreflightError(f"{what}: input {spec['name']!r} is {t.datatype}, the plan sends "
                                     f"{spec['datatype']} (request.datatype)")
            if t.shape and not shape_admits(list(t.shape), spec["shape"]):
                raise PreflightError(f"{what}: input {spec['name']!r} has shape {list(t.shape)}, the plan sends "
                                     f"{spec['shape']} (request.shape; -1 is any size)")
        ready = unary("ModelReady", pb.ModelReadyRequest(name=self.model, version=self.version), pb.ModelReadyResponse)
        if not ready.ready:
            raise PreflightError(f"{what} is not ready at {target.url} (ModelReady)")

    def probe_grpc(self, target: Target, ch: Any) -> None:
        """One request as the load sends it, judged as the load judges it."""
        req = self.next_request()
        call = ch.unary_unary(self.path, request_serializer=None, response_deserializer=self.response_type.FromString)
        msg = call(req.body, timeout=self.timeout, metadata=self.metadata)
        try:
            self.check_message(msg)
        except BadPayload as e:
            raise PreflightError(self.redact(f"target {target.url}: {self.path} answered OK but {e}")) from None


def shape_admits(declared: list[int], sent: list[int]) -> bool:
    """A model's declared shape admits the one sent: the same rank (or one less: a model with
    batching declares its shape without the batch dimension), every fixed size equal."""
    if len(declared) == len(sent) - 1:
        sent = sent[1:]
    return len(declared) == len(sent) and all(d < 0 or d == s for d, s in zip(declared, sent))

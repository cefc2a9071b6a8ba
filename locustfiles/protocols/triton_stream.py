"""Triton's decoupled models over gRPC: ``inference.GRPCInferenceService/ModelStreamInfer``.

A decoupled model (TensorRT-LLM, the vLLM backend, a Python model that sends several responses)
answers one request with N responses, on a bidirectional stream; Triton's HTTP endpoint refuses
such models, so this is the only way to time them.  Each request goes on a stream of its own: its
first response that carries output is the TTFT, the gaps between such responses the ITL, and the
end the response whose ``triton_final_response`` parameter is true (every request asks for it with
``triton_enable_empty_final_response``: without it a model that ends with a bare "final" flag sends
nothing the client could end on).  A stream that ends without it is truncated.

The text or tokens come from the output tensor ``[request] output_name`` (default "text_output"):
BYTES elements are text, counted as the ``openai`` protocol counts streamed text (the plan's
tokenizer over it, else one token per response that carried text, flagged as counted by the client);
an integer tensor holds token ids, which are the server's own count.  A response without any is
not a token (the same rule as a chunk without text).  Requests: ``kserve``'s keys, with
``[[request.inputs]] data`` giving literal values (``{{prompt}}`` and ``{{max_tokens}}`` filled), e.g.
a vLLM model's text_input, stream and sampling_parameters.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from kneeswarm.contracts.grpcapi.triton import grpc_service_pb2 as pb
from kneeswarm.contracts.plan import EndpointPlan
from kneeswarm.locustfiles.protocols.base import BadPayload, PreflightError, PreparedRequest, StreamTruncated
from kneeswarm.locustfiles.protocols.grpctensors import ITEM_SIZE, bytes_elements
from kneeswarm.locustfiles.protocols.kserve_grpc import SERVICE, KServeGrpc
from kneeswarm.locustfiles.protocols.grpcbase import Target

logger = logging.getLogger(__name__)

OUTPUT_NAME = "text_output"  # the vLLM and TensorRT-LLM backends' text output
FINAL = "triton_final_response"
ASK_FINAL = "triton_enable_empty_final_response"


class ResponseStream:
    """One streamed answer, response by response: its timing (perf_counter seconds) and tokens,
    with the attributes users.py reads of an SSE ChatStream."""

    __slots__ = ("t0", "first", "last", "itl_ms", "chunks", "responses", "done", "usage_out", "count", "texts",
                 "usage_in", "nbytes")

    def __init__(self, t0: float, count: Callable[[str], int] | None = None):
        self.t0 = t0
        self.first: float | None = None
        self.last = 0.0
        self.itl_ms: list[float] = []
        self.chunks = 0  # responses that carried output
        self.responses = 0
        self.done = False  # the final response (or the end of a server stream) seen
        self.usage_out: int | None = None  # token ids the server sent (an integer output)
        self.usage_in: int | None = None
        self.count = count  # the plan's tokenizer, or None
        self.texts: list[str] | None = [] if count is not None else None
        self.nbytes = 0

    def text(self, text: bytes, now: float) -> None:
        """A response's text (UTF-8 bytes), decoded only where it is kept (a tokenizer counts it)."""
        if text:
            if self.texts is not None:
                self.texts.append(text.decode("utf-8", "replace"))
            self._token(now)

    def ids(self, n: int, now: float) -> None:
        if n:
            self.usage_out = (self.usage_out or 0) + n
            self._token(now)

    def _token(self, now: float) -> None:
        if self.first is None:
            self.first = now
        else:
            self.itl_ms.append((now - self.last) * 1000.0)
        self.last = now
        self.chunks += 1

    @property
    def ttft_ms(self) -> float | None:
        return None if self.first is None else (self.first - self.t0) * 1000.0

    @property
    def tokens_counted(self) -> bool:
        return self.usage_out is None

    @property
    def tokens_tokenizer(self) -> int | None:
        return None if self.count is None or self.texts is None else self.count("".join(self.texts))

    @property
    def tokens_out(self) -> int:
        if self.usage_out is not None:
            return self.usage_out
        counted = self.tokens_tokenizer
        return self.chunks if counted is None else counted

    def check_complete(self) -> None:
        if not self.done:
            raise StreamTruncated(f"stream ended after {self.responses} responses ({self.chunks} with output) "
                                  f"without its final response")


class TritonStream(KServeGrpc):
    name = "triton-stream"
    kind = "stream_stream"
    path = f"/{SERVICE}/ModelStreamInfer"
    response_type = pb.ModelStreamInferResponse

    def __init__(self, request_cfg: dict, seed: int = 0, endpoint: EndpointPlan | None = None):
        self.output_name = str(request_cfg.get("output_name") or OUTPUT_NAME)
        super().__init__(request_cfg, seed, endpoint)

    def _prepared(self, fixed: bool) -> PreparedRequest:
        msg, tokens_in = self.message(fixed)
        msg.parameters[ASK_FINAL].bool_param = True
        return PreparedRequest("grpc", self.path, msg.SerializeToString(), self.headers, tokens_in=tokens_in,
                               stream=True, items=self.batch)

    def new_stream(self, t0: float) -> ResponseStream:
        return ResponseStream(t0, self.counter.count if self.cfg.get("tokenizer") else None)

    def feed(self, stream: ResponseStream, msg: Any, now: float) -> None:
        """One ModelStreamInferResponse of ``stream``, arrived at ``now``; BadPayload for an error."""
        stream.responses += 1
        if msg.error_message:
            raise BadPayload(f"stream response {stream.responses} is an error: {msg.error_message[:120]}")
        resp = msg.infer_response
        outputs = resp.outputs
        for i, out in enumerate(outputs):
            if out.name != self.output_name:
                continue
            raw = resp.raw_output_contents[i] if i < len(resp.raw_output_contents) else None
            if out.datatype == "BYTES":
                if raw is not None and len(raw) >= 4 and int.from_bytes(raw[:4], "little") == len(raw) - 4:
                    stream.text(raw[4:], now)  # one element, the usual case: no list made
                else:
                    items = bytes_elements(raw) if raw is not None else list(out.contents.bytes_contents)
                    stream.text(b"".join(items), now)
            elif raw is not None and out.datatype in ITEM_SIZE:
                stream.ids(len(raw) // ITEM_SIZE[out.datatype], now)
            else:
                c = out.contents
                stream.ids(len(c.int_contents) + len(c.int64_contents) + len(c.uint_contents)
                           + len(c.uint64_contents), now)
            break
        else:
            if outputs:
                raise BadPayload(f"stream response {stream.responses} has no output {self.output_name!r} (it has "
                                 f"{', '.join(o.name for o in outputs)}; request.output_name)")
        params = resp.parameters
        if FINAL in params and params[FINAL].bool_param:
            stream.done = True

    def check_message(self, msg: Any) -> None:
        """A whole stream's single answer (the preflight's probe reads the stream instead)."""
        self.feed(self.new_stream(0.0), msg, 0.0)

    def probe_grpc(self, target: Target, ch: Any) -> None:
        """One request on a stream as the load sends it, read to its final response."""
        import threading

        req = self.next_request()
        call = ch.stream_stream(self.path, request_serializer=None, response_deserializer=self.response_type.FromString)
        done = threading.Event()
        stream = self.new_stream(0.0)
        try:
            for i, msg in enumerate(call(request_stream(req.body, done), timeout=self.timeout, metadata=self.metadata)):
                self.feed(stream, msg, float(i))
                if stream.done:
                    break
            stream.check_complete()
        except BadPayload as e:
            raise PreflightError(self.redact(f"target {target.url}: {self.path}: {e}")) from None
        finally:
            done.set()


def request_stream(body: bytes, done: Any) -> Any:
    """The request side of a stream: the one request, then held open until ``done`` is set (the
    final response read, or the call over): a half-closed stream is the end of the requests, and
    a server may end its answers with it."""
    yield body
    done.wait()

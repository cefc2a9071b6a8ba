"""A user's gRPC calls: the gRPC protocols' requests sent inside Locust, each one row.

The inference user (users.py) keeps everything a request's row shares with HTTP -- closed and
open loop, the intended send time, the in-flight watermark, think time -- and hands a gRPC
protocol's requests to a ``GrpcSender``, which sends them on a channel and fires Locust's request
event with the same row as HTTP: start, latency, bytes, status (the HTTP status of the call's code,
grpcbase.HTTP_STATUS), the failure category (grpcbase.failure), tokens, and for a stream its
TTFT, ITL and token counts (users.StreamInfo).

gevent: Locust's workers run on gevent, and grpcio blocks a whole OS thread in its calls unless
its gevent integration is on; ``grpc.experimental.gevent.init_gevent()`` must run before the
process makes its first channel, so this module runs it when it is imported (only a Locust process
imports it; the conductor's preflight runs plain grpc on its own thread).

Channels: CHANNEL_SCOPE "user" gives every user a channel of its own (its own HTTP/2 connection,
as each HTTP user has its own keep-alive connection: the server sees as many connections as there
are users); "worker" shares one channel per process, every call a stream on one connection.
bench/grpc_channels.py measures both (docs/grpc.md: per user serves; a shared channel queues the
calls beyond the server's concurrent-stream limit inside the client, where the run cannot see it).

Times: a unary call is timed around the blocking call; a stream's responses are stamped when
grpc hands them to this greenlet (``time.perf_counter``), the first with output is the TTFT.
Unlike the HTTP reader, which stamps each read with the kernel's receive time, grpc gives no
per-message receive time: its own threads and this greenlet's scheduling are in the gaps.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import grpc
from grpc.experimental import gevent as grpc_gevent

from kneeswarm.contracts.plan import EndpointPlan
from kneeswarm.locustfiles.protocols.base import BadPayload, PreparedRequest
from kneeswarm.locustfiles.protocols.grpcbase import Target, channel, failure
from kneeswarm.locustfiles.protocols.triton_stream import request_stream

logger = logging.getLogger(__name__)

grpc_gevent.init_gevent()  # before any channel of this process (grpcio's rule)

CHANNEL_SCOPE = "user"  # "user": a channel per user; "worker": one shared by this process's users


class Answer:
    """What the recorder reads of a call's answer: its status (``RowBuffer.on_request``)."""

    __slots__ = ("status_code",)

    def __init__(self, status_code: int):
        self.status_code = status_code


_shared: dict[tuple, Any] = {}  # CHANNEL_SCOPE "worker": one channel per target and endpoint


class GrpcSender:
    """One user's gRPC calls: ``send(req, intended)`` sends one request and fires its row."""

    def __init__(self, user: Any, protocol: Any, target: str, endpoint: EndpointPlan):
        self.user, self.protocol = user, protocol
        self.fire = user.environment.events.request.fire
        key = (target, endpoint.ca_bundle, endpoint.client_cert, endpoint.client_key, endpoint.server_name,
               tuple(sorted(protocol.headers.items())))
        if CHANNEL_SCOPE == "worker":
            if key not in _shared:
                _shared[key] = channel(Target(target), endpoint, protocol.headers)
            self.channel, self._own = _shared[key], False
        else:
            self.channel, self._own = channel(Target(target), endpoint, protocol.headers), True
        make = {"unary": self.channel.unary_unary, "unary_stream": self.channel.unary_stream,
                "stream_stream": self.channel.stream_stream}[protocol.kind]
        self.call = make(protocol.path, request_serializer=None, response_deserializer=protocol.response_type.FromString)
        self.timeout, self.metadata = protocol.timeout, protocol.metadata
        self._last: Any = None  # the last stream, ending at the server (see _streamed)

    def close(self) -> None:
        if self._own:
            self.channel.close()

    def send(self, req: PreparedRequest, intended: float | None) -> None:
        """One call; with ``intended`` (open loop, epoch seconds) its row starts then and its
        latency counts the time it was sent late."""
        late = max(0.0, time.time() - intended) if intended is not None else 0.0
        start = intended if intended is not None else time.time()
        t0 = time.perf_counter() - late
        if req.stream:
            self._streamed(req, start, t0)
        else:
            self._unary(req, start, t0)

    def _unary(self, req: PreparedRequest, start: float, t0: float) -> None:
        context: dict[str, Any] = {}
        exc: BaseException | None = None
        status, nbytes = 200, 0
        try:
            msg = self.call(req.body, timeout=self.timeout, metadata=self.metadata)
            end = time.perf_counter()
            nbytes = msg.ByteSize()
            tokens = self.protocol.check_message(msg)
            if tokens is not None or req.tokens_in is not None:
                tin, tout = tokens if tokens is not None else (None, None)
                context["kneeswarm"] = (tin if tin is not None else req.tokens_in, tout, None)
        except grpc.RpcError as e:
            end, exc = time.perf_counter(), failure(e)
            status = exc.status
        except BadPayload as e:
            end, exc = time.perf_counter(), e
        self.fire(request_type="grpc", name="infer", response_time=(end - t0) * 1000.0, response_length=nbytes,
                  response=Answer(status), context=context, exception=exc, start_time=start)

    # A stream's row: every response read as it comes (its arrival stamped), the final one ends it.
    # The call is not drained (the server closes it once the request side is half-closed, done.set):
    # waiting for that close cost the user a round trip and 10 % of a stream's instructions
    # (bench/instructions.py, triton-stream: 6.22 M per request drained, 5.60 M not).
    def _streamed(self, req: PreparedRequest, start: float, t0: float) -> None:
        from kneeswarm.locustfiles.users import StreamInfo

        stream = self.protocol.new_stream(t0)
        done = threading.Event()
        exc: BaseException | None = None
        status, end, nbytes = 200, t0, 0
        responses = None
        try:
            responses = self._open(req, done)
            for msg in responses:
                end = time.perf_counter()
                nbytes += msg.ByteSize()
                self.protocol.feed(stream, msg, end)
                if stream.done:
                    break
            else:
                if hasattr(self.protocol, "server_stream_ended"):
                    self.protocol.server_stream_ended(stream)
            stream.check_complete()
        except grpc.RpcError as e:
            end, exc = time.perf_counter(), failure(e)
            status = exc.status
        except BadPayload as e:
            end, exc = time.perf_counter(), e
        finally:
            done.set()
        if responses is not None:
            if exc is None:  # ended well: the half-close just sent ends the call at the server; it is
                self._last = responses  # kept until the next, so that no collection cancels it meanwhile
            else:
                responses.cancel()
        context: dict[str, Any] = {
            "kneeswarm": (req.tokens_in, stream.tokens_out, stream.ttft_ms),
            "kneeswarm_stream": StreamInfo(stream.itl_ms, stream.tokens_counted, stream.usage_out, stream.chunks,
                                           stream.tokens_tokenizer, req.tokens_pinned)}
        self.fire(request_type="grpc", name="infer", response_time=(end - t0) * 1000.0, response_length=nbytes,
                  response=Answer(status), context=context, exception=exc, start_time=start)

    def _open(self, req: PreparedRequest, done: threading.Event) -> Any:
        if self.protocol.kind == "stream_stream":
            return self.call(request_stream(req.body, done), timeout=self.timeout, metadata=self.metadata)
        return self.call(req.body, timeout=self.timeout, metadata=self.metadata)

"""The inference user: a closed-loop FastHttpUser that sends one protocol's requests.

The protocol (protocols/) builds bodies and judges answers; the recorder (recorder.py)
turns every request into a row.  This class only joins the two, and times streamed answers.

What a request hands the recorder, in the request event's context:
- ``context["kneeswarm"] = (tokens_in, tokens_out, ttft_ms)`` when any is known (the recorder
  writes them to the row's columns);
- ``context["kneeswarm_stream"] = StreamInfo(...)`` for a streamed answer: every gap between
  text chunks (ms), whether tokens out were counted by the client (no ``usage`` from the server),
  the server's count, the chunks, and the independent counts usage is checked against (the
  plan's tokenizer over the streamed text, the length the request pinned).

A streamed answer is timed here, not by Locust: with ``stream=True`` Locust's response time
covers the headers only, so the user sets ``response_time`` to the end of the stream itself.

Open loop (``[load] mode = "open"``): each user is an arrival source of ``source_rate`` req/s
(Poisson or constant inter-arrival times) that sends every request in a greenlet of its own at
its intended time and never waits for answers; a request's latency (and TTFT) is measured from
its intended send time, and its row's t_start is that time, so a stalled server cannot hide
behind a slowed generator (coordinated omission).  At most ``max_inflight`` requests per process
are in flight; an arrival beyond that is a ``dropped`` failure row.  A replayed recording with
times (``[request] replay``) gives the arrival times instead of the Poisson/constant draws.
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from typing import Any, NamedTuple

import gevent
import gevent.ssl
from gevent.pool import Group
from locust import FastHttpUser, task

from kneeswarm.plan import EndpointPlan, join_base
from locustfiles.protocols import BadPayload, PreparedRequest, for_plan
from locustfiles.protocols.sse import Arrivals
from locustfiles import state

logger = logging.getLogger(__name__)

_user_ids = itertools.count()


class ArrivalDropped(Exception):
    """Open loop: an arrival found max_inflight requests in flight and was not sent."""

    category = "dropped"


_inflight = 0  # open-loop requests in flight in this process


class StreamInfo(NamedTuple):
    itl_ms: list[float]  # every gap between text chunks, in arrival order
    tokens_counted: bool  # True: tokens_out is the client's count, tokenizer else chunks (no usage from the server)
    usage_out: int | None  # the server's completion_tokens, when sent
    chunks: int  # text chunks the client saw (a chunk may carry several tokens)
    tokens_tokenizer: int | None = None  # the plan's tokenizer over the streamed text
    tokens_pinned: int | None = None  # the output length the request pinned (ignore_eos / min_tokens)


class InferenceUser(FastHttpUser):
    # FastHttpUser's defaults; the plan's request.timeout replaces these at init.
    network_timeout = 10.0
    connection_timeout = 10.0

    def __init__(self, environment: Any) -> None:
        """The plan's [endpoint] on this user's client: the base path after the host Locust
        gives (the plan's target, --host or the web UI's Host field), and for https:// the
        endpoint's TLS context (CA bundle, client certificate, server_name; unverified only where
        the plan says verify = false -- Locust's own default is not to verify).  Its headers come with
        every request from the protocol (``PreparedRequest.headers``)."""
        endpoint = state.plan().endpoint
        self.host = join_base(self.host or state.plan().target, endpoint.base_path)
        https = self.host.startswith("https://")
        if https:
            self.insecure = not endpoint.verify
            self.ssl_context_factory = _ssl_factory(endpoint)
        super().__init__(environment)
        if https and endpoint.server_name:  # SNI and the certificate's name: geventhttpclient's ssl_options,
            #  read when the pool makes its client for the host, at the first request
            self.client.client.clientpool.client_args["ssl_options"] = {"server_hostname": endpoint.server_name}

    def wait_time(self) -> float:
        return state.plan().load.wait_ms / 1000.0

    def on_start(self) -> None:
        seed = next(_user_ids) + 100_000 * max(0, self.environment.runner.worker_index)  # Locust's index
        plan = state.plan()
        self.protocol = for_plan(plan, seed=seed)
        self._open = plan.load.mode == "open"
        self._rng = random.Random(seed)
        self._in_flight = Group()  # not `_group`: that is Locust's own (User.stop kills through it)

    def on_stop(self) -> None:
        self._in_flight.kill(block=False)  # open loop: requests still in flight end with the user

    @task
    def infer(self) -> None:
        if self._open:
            self._arrivals()
            return
        self._send(self.protocol.next_request(), None)

    def _arrivals(self) -> None:
        """Open loop: this user's arrival process, for as long as the user lives."""
        load = state.plan().load
        replay = getattr(self.protocol, "replay", None)
        if replay is not None and replay.timed:
            self._recorded_arrivals(replay)
            return
        rate, poisson = load.source_rate, load.arrival == "poisson"
        gap = (lambda: self._rng.expovariate(rate)) if poisson else (lambda: 1.0 / rate)
        intended = time.time() + (gap() if poisson else self._rng.uniform(0.0, 1.0 / rate))
        while True:
            delay = intended - time.time()
            if delay > 0:
                gevent.sleep(delay)
            self._arrive(intended, None, load.max_inflight)
            intended += gap()

    def _recorded_arrivals(self, replay: Any) -> None:
        """Open loop over a recording with times (workload.Replay): the process's users take its
        arrivals in turn, at this process's rate (its users x source_rate), so the arrivals keep
        the recorded gaps, scaled to the step's rate, however many users hold a ticket."""
        load = state.plan().load
        runner = self.environment.runner
        while True:
            intended, req = replay.ticket(max(1, runner.user_count) * load.source_rate, time.time())
            delay = intended - time.time()
            if delay > 0:
                gevent.sleep(delay)
            self._arrive(intended, req, load.max_inflight)

    def _arrive(self, intended: float, req: PreparedRequest | None, cap: int) -> None:
        """One arrival: sent in a greenlet of its own, or a `dropped` row beyond ``cap`` in flight."""
        if _inflight >= cap:
            self.environment.events.request.fire(
                request_type="POST", name="infer", response_time=0.0, response_length=0, response=None,
                context={}, exception=ArrivalDropped(f"{cap} requests in flight (load.max_inflight)"),
                start_time=intended)
        else:
            self._in_flight.spawn(self._send_open, intended, req)

    def _send_open(self, intended: float, req: PreparedRequest | None = None) -> None:
        global _inflight
        _inflight += 1
        try:
            self._send(req if req is not None else self.protocol.next_request(), intended)
        except Exception as e:  # noqa: BLE001 - outside Locust's task loop: counted here, never lost
            logger.warning("kneeswarm: open-loop request failed outside the HTTP client: %r", e)
            self.environment.events.request.fire(
                request_type="POST", name="infer", response_time=(time.time() - intended) * 1000.0,
                response_length=0, response=None, context={}, exception=e, start_time=intended)
        finally:
            _inflight -= 1

    def _send(self, req: PreparedRequest, intended: float | None) -> None:
        """One request; with ``intended`` (open loop, epoch seconds) timed from that instant."""
        late = max(0.0, time.time() - intended) if intended is not None else 0.0
        if req.stream:
            self._streamed(req, late, intended)
            return
        with self.client.request(
            req.method, req.path, data=req.body, headers=req.headers, catch_response=True, name="infer"
        ) as resp:
            if intended is not None:
                resp.request_meta["start_time"] = intended
                resp.request_meta["response_time"] = resp.request_meta.get("response_time", 0.0) + late * 1000.0
            status = resp.status_code
            if 200 <= status < 300:
                try:
                    tokens = self.protocol.check_response(resp.content)
                except BadPayload as e:
                    resp.failure(e)
                    return
                if tokens is not None or req.tokens_in is not None:
                    tin, tout = tokens if tokens is not None else (None, None)
                    resp.request_meta["context"]["kneeswarm"] = (tin if tin is not None else req.tokens_in, tout, None)
                if resp.request_meta["exception"] is None:  # judged: Locust's own check would repeat ours
                    resp.success()
            elif status:
                resp.failure(f"HTTP {status}")
            # status 0: a network error; Locust already carries the exception

    def _streamed(self, req: PreparedRequest, late: float = 0.0, intended: float | None = None) -> None:
        t0 = time.perf_counter() - late  # open loop: the clock starts at the intended send time
        with self.client.request(
            req.method, req.path, data=req.body, headers=req.headers, catch_response=True, name="infer",
            stream=True,
        ) as resp:
            if intended is not None:
                resp.request_meta["start_time"] = intended
                resp.request_meta["response_time"] = resp.request_meta.get("response_time", 0.0) + late * 1000.0
            status = resp.status_code
            if not status:
                return  # a network error before the headers; Locust carries the exception
            if not 200 <= status < 300:
                _ = resp.content  # read the error body so the connection can be reused
                resp.failure(f"HTTP {status}")
                return
            if not (resp.headers.get("content-type") or "").startswith("text/event-stream"):
                self._whole_instead(req, resp, t0)  # a server that ignores "stream": true
                return
            stream = self.protocol.new_stream(t0)
            nbytes, error = read_stream(resp, stream)
            end = time.perf_counter()
            meta = resp.request_meta
            meta["response_time"] = (end - t0) * 1000.0
            meta["response_length"] = nbytes
            if error is None:
                try:
                    stream.check_complete()
                except BadPayload as e:
                    error = e
            meta["context"]["kneeswarm"] = (stream.usage_in if stream.usage_in is not None else req.tokens_in,
                                            stream.tokens_out, stream.ttft_ms)
            meta["context"]["kneeswarm_stream"] = StreamInfo(stream.itl_ms, stream.tokens_counted,
                                                             stream.usage_out, stream.chunks,
                                                             stream.tokens_tokenizer, req.tokens_pinned)
            if error is not None:
                resp.failure(error)
            else:
                resp.success()


    def _whole_instead(self, req: PreparedRequest, resp: Any, t0: float) -> None:
        """A streamed request answered in one piece: judged as a whole answer, no TTFT."""
        try:
            body = resp.content or b""
            tokens = self.protocol.check_response(body)
        except BadPayload as e:
            resp.failure(e)
            return
        except Exception as e:  # noqa: BLE001 - the connection broke while reading the body
            resp.failure(e)
            return
        resp.request_meta["response_time"] = (time.perf_counter() - t0) * 1000.0
        resp.request_meta["response_length"] = len(body)
        tin, tout = tokens if tokens is not None else (None, None)
        resp.request_meta["context"]["kneeswarm"] = (tin if tin is not None else req.tokens_in, tout, None)
        resp.success()


_ssl_contexts: dict[tuple, Any] = {}  # one context per endpoint's TLS settings, shared by this process's users


def _ssl_factory(endpoint: EndpointPlan) -> Any:
    """A factory geventhttpclient calls for each connection pool (it passes its own CA file as
    ``cafile``, ignored here: the plan's trust replaces it)."""
    key = (endpoint.ca_bundle, endpoint.verify, endpoint.client_cert, endpoint.client_key)
    if key not in _ssl_contexts:
        _ssl_contexts[key] = endpoint.ssl_context(gevent.ssl.create_default_context)
    ctx = _ssl_contexts[key]
    return lambda cafile=None, **_kw: ctx


def read_stream(resp: Any, stream: Any) -> tuple[int, BaseException | None]:
    """Feed ``stream`` every SSE event of ``resp`` as it arrives: (bytes read, error or None).

    Reads the way geventhttpclient's own ``readline`` does (its body buffer, its socket, its
    parser), but hands the stream every complete event of each arrival at once
    (``ChatStream.block``): events that arrived in one read share its arrival time, and the
    per-line calls (most of the generator's cost on a fast stream, bench/protocols.py) are gone.  Locust's ``iter_content``
    would wait for whole 1 KiB blocks and smear the token times.  A connection that ends early
    raises in the parser: that error is returned (a stream cut off mid-way is then judged
    truncated by ``check_complete``; a reset or a timeout keeps its own category).
    """
    raw = resp._response
    buf = raw._body_buffer  # filled by raw.feed(); what came with the headers is already there
    arrivals, nbytes = Arrivals(stream), 0
    clock = time.perf_counter
    now = clock()
    try:
        while True:
            if buf:
                chunk = bytes(buf)
                del buf[:]
                nbytes += len(chunk)
                arrivals.feed(chunk, now)
            if raw.message_complete or raw._sock is None:
                break
            chunk = raw._sock.recv(raw.block_size)
            now = clock()
            raw.feed(chunk)  # b"" (closed early): the parser raises "Incomplete response"
        arrivals.close(now)
    except BadPayload as e:
        raw.release()
        return nbytes, e
    except Exception as e:  # noqa: BLE001 - the connection's own error, categorized by the recorder
        raw.release()
        if type(e).__name__ == "HTTPParseError" or "incomplete" in str(e).lower():
            return nbytes, None  # the server closed mid-stream: check_complete says truncated
        return nbytes, e
    return nbytes, None

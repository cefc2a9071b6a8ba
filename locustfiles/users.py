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

Open loop (``[load] arrivals = "open"``): each user is an arrival source of ``source_rate`` req/s
(Poisson or constant inter-arrival times, drawn afresh each run) that sends every request in a
greenlet of its own at its intended time and never waits for answers; a request's latency (and
TTFT) is measured from its intended send time, and its row's t_start is that time, so a stalled
server cannot hide behind a slowed generator (coordinated omission).  At most ``max_inflight`` requests per process
are in flight; an arrival beyond that is a ``dropped`` failure row.  A replayed recording with
times (``[request] replay``) gives the arrival times instead of the Poisson/constant draws.

Every request's start is marked in ``watermark.IN_FLIGHT`` until its row is recorded (the row
watermark the master judges steps by): closed loop, the time before it is sent (its row's t_start
is Locust's, a moment later); open loop, its intended send time from the moment it is drawn, so an
arrival the generator is late to send holds the watermark back at the start its row will carry.
The mark is taken off only after the request event fired (the row is in the RowBuffer): closed
loop in a ``finally``, open loop when the request's greenlet has died however it died (a link:
one killed before it ran never reaches its own ``finally``).
"""

from __future__ import annotations

import itertools
import logging
import platform
import random
import socket
import struct
import sys
import time
import weakref
from typing import Any, NamedTuple

import gevent
import gevent.ssl
from gevent.pool import Group
from geventhttpclient.connectionpool import ConnectionPool
from geventhttpclient.response import HTTPConnectionClosed
from locust import FastHttpUser, task

from kneeswarm.contracts.plan import EndpointPlan, join_base
from kneeswarm.locustfiles.protocols import BadPayload, PreparedRequest, for_plan
from kneeswarm.locustfiles.protocols.base import request_name
from kneeswarm.locustfiles.protocols.sse import Arrivals
from kneeswarm.locustfiles import state
from kneeswarm.locustfiles.watermark import IN_FLIGHT

# A request the server closed its kept-alive connection on (a clean close, FIN) before a single
# byte of answer is sent once more, on a new connection, and only the second attempt is recorded;
# a reset (RST) stays a `conn_reset` failure, but for the keep-alive race below.  llama.cpp's
# llama-server closes the connection after every streamed answer, a moment after its last chunk;
# a user's next request sent in that moment finds the socket closed ("connection closed.") --
# 16 % of requests at one user in the conformance suite (tests_conformance/test_llamacpp.py),
# none of which the server had seen (its own count of requests equals the rows).  Browsers resend
# in this case too; a connection that closes again is a failure, recorded as such.
STALE_CONNECTION_RETRIES = 1
# A reset is resent too, once, where it is the keep-alive race: the connection came from the pool
# after sitting idle KEEPALIVE_RACE_IDLE_S or more, and no byte of answer came back.  A server
# closes an idle kept-alive connection after its own timeout (uvicorn's timeout_keep_alive, 5 s by
# default: vLLM, KServe, the demo target; gunicorn 2 s; Node 5 s); a request sent on it at that
# moment reaches the server's socket before its close(), and a socket closed with unread data
# answers with a reset, not a FIN.  The server never served it.  Measured against the demo target:
# of 1,020 requests sent on connections idle 4.990-5.010 s, 149 were reset and 368 met a clean
# close (a raw-socket client without the pool's liveness check).  An open loop leaves connections
# idle that long (a source's extra connections, opened in a stall, wait for the next), and one such
# reset failed tests/test_open_loop.py on CI.  Chrome resends any request reset on a reused
# connection before its response; here only after idleness, so that a reset on a connection in use
# -- a server failing under load, the demo target's --reset-rate -- stays a `conn_reset` failure.
KEEPALIVE_RACE_IDLE_S = 1.0
_returned_at: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # pooled socket -> when it went back


def _stamp_pool_idleness() -> None:
    """geventhttpclient's ConnectionPool records when each socket went back to the pool and, as it
    hands one out, how long it sat there: the asking greenlet's ``kneeswarm_idle`` (None: a new
    connection; each request runs in one greenlet, a closed-loop user's or an open-loop arrival's).
    Its own liveness check before reuse (a readable idle socket: the server's FIN) is kept.  Once
    per process."""
    get, give = ConnectionPool.get_socket, ConnectionPool.return_socket
    if getattr(get, "kneeswarm", False):
        return

    def get_socket(self: ConnectionPool) -> Any:
        me = gevent.getcurrent()
        me.kneeswarm_idle = None  # a connection that fails to open is no reused one
        sock = get(self)
        since = _returned_at.pop(sock, None)
        if since is not None:
            me.kneeswarm_idle = time.monotonic() - since
        return sock

    def return_socket(self: ConnectionPool, sock: Any) -> None:
        _returned_at[sock] = time.monotonic()
        give(self, sock)

    get_socket.kneeswarm = True  # type: ignore[attr-defined]
    ConnectionPool.get_socket = get_socket  # type: ignore[method-assign]
    ConnectionPool.return_socket = return_socket  # type: ignore[method-assign]


_stamp_pool_idleness()
# A stream's reader acknowledges every arrival at once (Linux TCP_QUICKACK, re-armed after each
# read: the kernel clears it).  A server that writes its chunks with Nagle's algorithm on --
# llama.cpp's llama-server: cpp-httplib's CPPHTTPLIB_TCP_NODELAY is false -- holds each small write
# until the previous one is acknowledged, and a reader's delayed ACK (up to 40 ms) then bunches a
# whole answer's tokens into one or two arrivals: TTFT came out as the whole latency and TPOT as
# ~0 in the conformance suite (1.2 ms per token on the server).  Acknowledging at once lets each
# chunk leave when the server writes it.
QUICKACK = getattr(socket, "TCP_QUICKACK", None)
# Every arrival of a stream is stamped with the kernel's receive time of its last segment (Linux
# SO_TIMESTAMPNS: a `struct timespec` of CLOCK_REALTIME with each read), not the moment this
# process got round to reading it: a load generator's own scheduling -- greenlets, its recorder,
# the agents and the server on the same cores -- delayed reads by a median of 0.1 ms but 7 ms at
# the 95th percentile and up to 97 ms in the conformance suite (user-space minus kernel stamp,
# llama-server, 397 streams), which moved the TPOT of one request in ten by more than 10 %
# (tests_conformance/test_llamacpp.py).  Python names no SO_TIMESTAMPNS: 35 is its value on Linux
# but for alpha, mips, parisc and sparc (their own numbering), where user-space stamps are kept.
RX_TIMESTAMP = 35 if sys.platform == "linux" and platform.machine().lower().startswith(
    ("x86", "i686", "i386", "amd64", "aarch64", "arm", "ppc", "powerpc", "s390", "riscv", "loongarch")) else None
_TIMESPEC = struct.Struct("@ll")  # the "old" timespec SO_TIMESTAMPNS gives: native long seconds, nanoseconds

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
    _grpc: Any = None  # a gRPC protocol's sender (grpcuser.GrpcSender), made at on_start

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
        """``[load] wait_ms``; in a conversation, its think time between turns (protocols/openai.py)."""
        wait = state.plan().load.wait_ms / 1000.0
        think = getattr(getattr(self, "protocol", None), "think_s", None)
        return think(wait) if think is not None else wait

    def on_start(self) -> None:
        seed = next(_user_ids) + 100_000 * max(0, self.environment.runner.worker_index)  # Locust's index
        plan = state.plan()
        self.protocol = for_plan(plan, seed=seed)
        self._open = plan.load.arrivals == "open"
        # Arrival times: fresh draws every run (OS entropy), unlike the request bodies (seeded per user,
        # reproducible).  Seeded by user index, every run replayed the same Poisson sample: a 2.8 s
        # window at 10/s from one source counted 19 arrivals (the 5th percentile of Poisson(28)) in
        # every run, so a short step read 7.0 req/s offered 10, again and again.
        self._rng = random.Random()
        self._in_flight = Group()  # not `_group`: that is Locust's own (User.stop kills through it)
        if getattr(self.protocol, "grpc", False):  # a gRPC protocol: its calls go through grpcuser.py
            from kneeswarm.locustfiles.grpcuser import GrpcSender

            self._grpc = GrpcSender(self, self.protocol, self.host or plan.target, plan.endpoint)

    def stop(self, force: bool = False) -> bool:
        """Locust's stop.  Open loop: always at once -- the user's task is its arrival process, which
        never ends on its own, and the requests it sent run in greenlets of their own (``_in_flight``)
        that complete and are recorded after it (on_stop); a closed-loop user given Locust's
        stop_timeout (plugin.STOP_MARGIN_S) finishes the request it is in first."""
        return super().stop(force=force or getattr(self, "_open", False))

    def on_stop(self) -> None:
        """Open loop: the user's arrivals end with it, but the requests it has already sent are
        left to complete and be recorded: a step that takes sources away (a search refining
        downwards) would otherwise lose the rows of its predecessor's requests in flight -- at a
        saturated probe, its whole queue -- and the server would serve them to closed sockets.
        A closed-loop gRPC user's channel is closed (open loop: left to its requests in flight)."""
        if self._grpc is not None and not self._open:
            self._grpc.close()

    @task
    def infer(self) -> None:
        if self._open:
            self._arrivals()
            return
        t = time.time()  # at or before the row's t_start (Locust's, taken as the request is sent)
        IN_FLIGHT.begin(t)
        try:
            self._send(self.protocol.next_request(), None)
        finally:  # the request event has fired (its row is recorded), or the user was killed in it
            IN_FLIGHT.end(t)

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
            self._arrive_at(intended, None, load.max_inflight)
            intended += gap()

    def _recorded_arrivals(self, replay: Any) -> None:
        """Open loop over a recording with times (workload.Replay): the process's users take its
        arrivals in turn, at this process's rate (its users x source_rate), so the arrivals keep
        the recorded gaps, scaled to the step's rate, however many users hold a ticket."""
        load = state.plan().load
        runner = self.environment.runner
        while True:
            intended, req = replay.ticket(max(1, runner.user_count) * load.source_rate, time.time())
            self._arrive_at(intended, req, load.max_inflight)

    def _arrive_at(self, intended: float, req: PreparedRequest | None, cap: int) -> None:
        """Wait for an arrival's intended time, then send it (``_arrive``).  Its start is marked
        (IN_FLIGHT) from now: the row will start at ``intended`` however late it is sent."""
        IN_FLIGHT.begin(intended)
        handed = False
        try:
            delay = intended - time.time()
            if delay > 0:
                gevent.sleep(delay)
            handed = self._arrive(intended, req, cap)
        finally:  # not handed to a request greenlet: its row is recorded, or the user was stopped first
            if not handed:
                IN_FLIGHT.end(intended)

    def _arrive(self, intended: float, req: PreparedRequest | None, cap: int) -> bool:
        """One arrival: sent in a greenlet of its own (True: that greenlet's end takes its IN_FLIGHT
        mark off), or a `dropped` row beyond ``cap`` in flight (False)."""
        if _inflight >= cap:
            self.environment.events.request.fire(
                request_type="POST", name="infer", response_time=0.0, response_length=0, response=None,
                context={}, exception=ArrivalDropped(f"{cap} requests in flight (load.max_inflight)"),
                start_time=intended)
            return False
        g = self._in_flight.spawn(self._send_open, intended, req)
        g.rawlink(lambda _g: IN_FLIGHT.end(intended))  # after its row, or when killed (before it ran too)
        return True

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
        """One request; with ``intended`` (open loop, epoch seconds) timed from that instant.  A
        conversation's turn hands its outcome back to the protocol (its answer joins the history)."""
        self._answer: tuple[bool, Any] = (False, None)
        if self._grpc is not None:  # gRPC: one call, one row (grpcuser.py); no conversations there
            self._grpc.send(req, intended)
            return
        for attempt in range(1 + STALE_CONNECTION_RETRIES):
            late = max(0.0, time.time() - intended) if intended is not None else 0.0
            sent = (self._streamed(req, late, intended, attempt) if req.stream
                    else self._whole(req, late, intended, attempt))
            if sent:
                break
        if req.turn is not None:
            self.protocol.answered(*self._answer)  # type: ignore[attr-defined]

    @staticmethod
    def _answering(resp: Any, req: PreparedRequest, intended: float | None, late: float, attempt: int) -> bool:
        """What every row gets once an answer began (whole or streamed): False when the request is
        to be sent again instead (``_closed_unanswered``); else the row's resend count, its timing
        from the intended instant (open loop), and the LLM workload's (prefix, turn) and the mix's class (recorder TAG_COLUMNS)."""
        if _closed_unanswered(resp, attempt):
            return False
        meta = resp.request_meta
        if attempt:  # this row is a resend: counted (the row's `resent`, each step's in summary.json)
            meta["context"]["kneeswarm_resent"] = attempt
        _timed_from(resp, intended, late)
        if req.prefix is not None or req.turn is not None or req.klass is not None:
            meta["context"]["kneeswarm_tags"] = (req.prefix, req.turn, req.klass)
        return True

    def _whole(self, req: PreparedRequest, late: float, intended: float | None, attempt: int) -> bool:
        """One not-streamed request; False when it is to be sent again (``_closed_unanswered``)."""
        with self.client.request(  # Locust's annotation of data omits bytes, which it sends as they are
            req.method, req.path, data=req.body, headers=req.headers, catch_response=True, name=request_name(req.klass)  # type: ignore[arg-type]
        ) as resp:
            if not self._answering(resp, req, intended, late, attempt):
                return False
            status = resp.status_code
            if 200 <= status < 300:
                try:
                    tokens = _judge(self.protocol, req).check_response(resp.content)
                except BadPayload as e:
                    resp.failure(e)
                    return True  # answered, judged bad: not sent again
                self._answer = (True, None)
                if tokens is not None or req.tokens_in is not None:
                    tin, tout = tokens if tokens is not None else (None, None)
                    resp.request_meta["context"]["kneeswarm"] = (tin if tin is not None else req.tokens_in, tout, None)
                if resp.request_meta["exception"] is None:  # judged: Locust's own check would repeat ours
                    resp.success()
            elif status:
                resp.failure(f"HTTP {status}")
            # status 0: a network error; Locust already carries the exception
        return True

    def _streamed(self, req: PreparedRequest, late: float = 0.0, intended: float | None = None,
                  attempt: int = STALE_CONNECTION_RETRIES) -> bool:
        """One streamed request; False when it is to be sent again (``_closed_unanswered``)."""
        t0 = time.perf_counter() - late  # open loop: the clock starts at the intended send time
        with self.client.request(  # Locust's annotation of data omits bytes, which it sends as they are
            req.method, req.path, data=req.body, headers=req.headers, catch_response=True, name=request_name(req.klass),  # type: ignore[arg-type]
            stream=True,
        ) as resp:
            if not self._answering(resp, req, intended, late, attempt):
                return False
            status = resp.status_code
            if not status:
                return True  # a network error before the headers; Locust carries the exception
            if not 200 <= status < 300:
                _ = resp.content  # read the error body so the connection can be reused
                resp.failure(f"HTTP {status}")
                return True
            if not (resp.headers.get("content-type") or "").startswith("text/event-stream"):
                self._whole_instead(req, resp, t0)  # a server that ignores "stream": true
                return True
            stream = _judge(self.protocol, req).new_stream(t0)
            nbytes, error, end = read_stream(resp, stream)
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
                self._answer = (True, stream)
        return True


    def _whole_instead(self, req: PreparedRequest, resp: Any, t0: float) -> None:
        """A streamed request answered in one piece: judged as a whole answer, no TTFT."""
        try:
            body = resp.content or b""
            tokens = _judge(self.protocol, req).check_response(body)
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
        self._answer = (True, None)


_ssl_contexts: dict[tuple, Any] = {}  # one context per endpoint's TLS settings, shared by this process's users


def _ssl_factory(endpoint: EndpointPlan) -> Any:
    """A factory geventhttpclient calls for each connection pool (it passes its own CA file as
    ``cafile``, ignored here: the plan's trust replaces it)."""
    key = (endpoint.ca_bundle, endpoint.verify, endpoint.client_cert, endpoint.client_key)
    if key not in _ssl_contexts:
        _ssl_contexts[key] = endpoint.ssl_context(gevent.ssl.create_default_context)
    ctx = _ssl_contexts[key]
    return lambda cafile=None, **_kw: ctx


def _judge(protocol: Any, req: PreparedRequest) -> Any:
    """The protocol that judges ``req``'s answer: in a traffic mix its class's (protocols/mix.py)."""
    return protocol.of(req) if req.klass is not None else protocol


def _timed_from(resp: Any, intended: float | None, late: float) -> None:
    """Open loop: the request's row starts at its intended send time and its latency counts the
    time it was late (``late`` seconds), so a stalled server cannot hide behind a slowed generator."""
    if intended is not None:
        resp.request_meta["start_time"] = intended
        resp.request_meta["response_time"] = resp.request_meta.get("response_time", 0.0) + late * 1000.0


def _closed_unanswered(resp: Any, attempt: int) -> bool:
    """The server closed the connection before a byte of answer -- cleanly (geventhttpclient's
    HTTPConnectionClosed for an empty read), or with a reset on a connection that had sat idle in the
    pool KEEPALIVE_RACE_IDLE_S or more (the same class raised from inside its ECONNRESET handler, or
    the reset itself while the request was sent) -- and a retry is left: the attempt
    is not reported (Locust reports a with-block whose manual result is False as nothing) and the
    caller sends the request again (STALE_CONNECTION_RETRIES)."""
    err = resp.request_meta.get("exception")
    if attempt >= STALE_CONNECTION_RETRIES or resp.status_code or err is None:
        return False
    if isinstance(err, HTTPConnectionClosed):
        reset = isinstance(err.__context__, OSError)  # geventhttpclient raised it for an ECONNRESET
    elif isinstance(err, (ConnectionResetError, BrokenPipeError)):
        reset = True  # reset while the request was sent
    else:
        return False
    if reset:  # resent only where it is the keep-alive race (KEEPALIVE_RACE_IDLE_S)
        idle = getattr(gevent.getcurrent(), "kneeswarm_idle", None)
        if idle is None or idle < KEEPALIVE_RACE_IDLE_S:
            return False
    resp._manual_result = False  # Locust's ResponseContextManager: neither success nor failure is fired
    return True


def _quickack(sock: Any) -> Any:
    """A call that (re-)arms TCP_QUICKACK on ``sock`` (see QUICKACK); a no-op where there is none."""
    if QUICKACK is None or sock is None:
        return lambda: None
    set_opt = sock.setsockopt

    def arm() -> None:
        try:
            set_opt(socket.IPPROTO_TCP, QUICKACK, 1)
        except OSError:
            pass

    return arm


_stamp_keeper: list[socket.socket] = []


def _keep_stamping() -> None:
    """The kernel stamps arriving packets only while some socket asks for it, and turns stamping
    on again a moment after the first asks (deferred work): a stream's first segments on each new
    connection came without a stamp.  One socket of this process that always asks keeps it on."""
    if not _stamp_keeper and RX_TIMESTAMP is not None:
        keeper = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        keeper.setsockopt(socket.SOL_SOCKET, RX_TIMESTAMP, 1)
        _stamp_keeper.append(keeper)


PAIR_WITHIN_S = 20e-6  # two clock reads this close are one instant (a few hundred ns apart unpreempted)


def _same_instant(clock: Any) -> tuple[float, float]:
    """(``clock()``, ``time.time()``) at one instant: ``time.time()`` read between two ``clock()``
    reads, paired with their middle; read again (three tries, the closest pair kept) when they lie
    more than PAIR_WITHIN_S apart.  Read one after the other, a preemption between the two
    (ms on a busy machine) would move every kernel stamp converted with them by its length."""
    best = (float("inf"), 0.0, 0.0)
    for _ in range(3):
        before, wall, after = clock(), time.time(), clock()
        if after - before < best[0]:
            best = (after - before, (before + after) / 2.0, wall)
        if after - before <= PAIR_WITHIN_S:
            break
    return best[1], best[2]


def _receiver(sock: Any, clock: Any = time.perf_counter) -> Any:
    """A call ``recv(n) -> (bytes, arrival)``: what ``sock`` holds and when its last byte reached
    this machine, on ``clock`` -- the kernel's receive time (RX_TIMESTAMP), not when this process
    got round to reading it.  Falls back to ``clock()`` after the read where the kernel gives none."""
    recvmsg = getattr(sock, "recvmsg", None)
    if RX_TIMESTAMP is None or recvmsg is None or hasattr(sock, "do_handshake"):  # TLS: no recvmsg
        return lambda n: (sock.recv(n), clock())
    try:
        sock.setsockopt(socket.SOL_SOCKET, RX_TIMESTAMP, 1)
        _keep_stamping()
    except OSError:
        return lambda n: (sock.recv(n), clock())
    space = socket.CMSG_SPACE(_TIMESPEC.size)

    def recv(n: int) -> tuple[bytes, float]:
        data, ancillary, _flags, _addr = recvmsg(n, space)
        for level, kind, raw in ancillary:
            if level == socket.SOL_SOCKET and kind == RX_TIMESTAMP and len(raw) >= _TIMESPEC.size:
                sec, nsec = _TIMESPEC.unpack_from(raw)
                now, wall = _same_instant(clock)
                return data, min(now, now - (wall - (sec + nsec * 1e-9)))
        return data, clock()

    return recv


def read_stream(resp: Any, stream: Any) -> tuple[int, BaseException | None, float]:
    """Feed ``stream`` every SSE event of ``resp`` as it arrives: (bytes read, error or None, when
    the last byte arrived on ``time.perf_counter``'s clock).

    Reads the way geventhttpclient's own ``readline`` does (its body buffer, its socket, its
    parser), but hands the stream every complete event of each arrival at once
    (``ChatStream.block``): events that arrived in one read share its arrival time, and the
    per-line calls (most of the generator's cost on a fast stream, bench/protocols.py) are gone.  Locust's ``iter_content``
    would wait for whole 1 KiB blocks and smear the token times.  Each arrival is stamped with the
    kernel's receive time (``_receiver``, RX_TIMESTAMP).  A connection that ends early
    raises in the parser: that error is returned (a stream cut off mid-way is then judged
    truncated by ``check_complete``; a reset or a timeout keeps its own category).
    """
    raw = resp._response
    buf = raw._body_buffer  # filled by raw.feed(); what came with the headers is already there
    arrivals, nbytes = Arrivals(stream), 0
    now = time.perf_counter()  # what came with the headers: read before this reader, stamped now
    quickack = _quickack(raw._sock)
    recv = _receiver(raw._sock) if raw._sock is not None else None
    try:
        while True:
            if buf:
                chunk = bytes(buf)
                del buf[:]
                nbytes += len(chunk)
                arrivals.feed(chunk, now)
            if raw.message_complete or raw._sock is None or recv is None:
                break
            quickack()
            chunk, at = recv(raw.block_size)
            now = max(now, at)  # never before an earlier arrival (what came with the headers is stamped late)
            raw.feed(chunk)  # b"" (closed early): the parser raises "Incomplete response"
        arrivals.close(now)
    except BadPayload as e:
        raw.release()
        return nbytes, e, now
    except Exception as e:  # noqa: BLE001 - the connection's own error, categorized by the recorder
        raw.release()
        if type(e).__name__ == "HTTPParseError" or "incomplete" in str(e).lower():
            return nbytes, None, now  # the server closed mid-stream: check_complete says truncated
        return nbytes, e, now
    return nbytes, None, now

"""Where requests wait and run: the two engines of the demo target.

``OnnxEngine`` (``--mode onnx``) is the application's request pool, as the article describes it:
a bounded FIFO queue in front of ``request_threads`` worker threads that share ONE ONNX Runtime
session. The async handler puts the request on the queue (503 when the queue is full) and awaits a
future that a worker resolves with ``loop.call_soon_threadsafe``; inference never runs on the
event loop. With ``copy_per_request`` (``--model-copy-per-request``, a copy per concurrent request:
the anti-pattern the ``model_copies`` finding names) a batch runs on a session of its own, taken
from a pool that opens one more (``make_session``) whenever none is free: the pool grows to the
concurrency seen, and the memory with it. With ``batch_max`` > 1 a micro-batcher forms batches: the worker whose turn it is
takes the oldest request, then keeps taking queued requests until it holds ``batch_max`` of them
or ``batch_wait_s`` has passed since the oldest one was queued, and runs them as one batch (while
it runs, the next free worker collects the next batch).

``KneeEngine`` (``--mode knee``) is the ground truth: ``slots`` requests are served at once, each
holds its slot for ``service_s`` seconds and burns no CPU; the others wait in FIFO order. Slot
times are kept on a virtual clock (a request that was waiting when a slot freed starts exactly
when it freed), so event-loop jitter does not leak into throughput: in a closed loop with ``u``
users, QPS = min(u, slots) / service_s and the knee is exactly at ``slots`` users.

``UslEngine`` (``--mode usl``) is the second ground truth: every request is served at once for
T·(1 + σ(N−1) + κN(N−1)) seconds, N the number in service when it starts, so a closed loop follows
the Universal Scalability Law exactly (see its docstring for why N is sampled at the start).

Both sleep-based engines take an optional ``Warmup`` (``--warmup-s``, ``--warmup-extra-ms``): extra
time that falls linearly to 0 over the first seconds of load, a latency drift to cut as warm-up; and
an optional ``Jitter`` (``--jitter``, jitter.py): each service time multiplied by seeded noise of mean 1.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kneeswarm.target.jitter import Jitter
from kneeswarm.target.metrics import TargetMetrics
from kneeswarm.target.model import INPUT_NAME, OUTPUT_NAME

logger = logging.getLogger(__name__)

WORKER_THREAD_PREFIX = "kneeswarm-infer"
STOP_JOIN_TIMEOUT_S = 5.0


class Rejected(Exception):
    """The bounded queue is full: answer 503."""


@dataclass
class _Job:
    x: np.ndarray
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    enqueued: float = field(default_factory=time.monotonic)


_STOP = object()


def _resolve(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():  # cancelled while it ran (server shutting down)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class OnnxEngine:
    """A bounded queue feeding ``request_threads`` threads that share one session."""

    def __init__(
        self,
        session: Any,
        metrics: TargetMetrics,
        request_threads: int,
        queue_size: int = 0,
        batch_max: int = 1,
        batch_wait_s: float = 0.0,
        make_session: Any = None,
    ) -> None:
        self._session = session
        self._make_session = make_session  # given: a session per concurrent batch, from a growing pool
        self._free_sessions: list[Any] = [session]
        self._pool_lock = threading.Lock()
        self.sessions = 1  # sessions opened (the model's copies in memory)
        self._metrics = metrics
        self._request_threads = request_threads
        self._queue_size = queue_size  # 0 = unbounded
        self._batch_max = batch_max
        self._batch_wait_s = batch_wait_s
        self._queue: queue.SimpleQueue[_Job | object] = queue.SimpleQueue()
        self._collect_lock = threading.Lock()  # one micro-batch is collected at a time
        self._count_lock = threading.Lock()
        self._queued = 0  # in the queue or held by the batch being collected
        self._inflight = 0
        self._threads: list[threading.Thread] = []
        metrics.track_queue_length(lambda: self._queued)
        metrics.track_inflight(lambda: self._inflight)

    # -- event-loop side ------------------------------------------------------------------------
    def start(self) -> None:
        for i in range(self._request_threads):
            name = f"{WORKER_THREAD_PREFIX}-{i}"
            t = threading.Thread(target=self._worker, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        for _ in self._threads:
            self._queue.put(_STOP)
        deadline = time.monotonic() + STOP_JOIN_TIMEOUT_S
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        self._threads.clear()

    async def infer(self, x: np.ndarray) -> np.ndarray:
        """Queue ``x`` ([rows, input_dim] float32) and wait for its output rows."""
        # Only the event-loop thread adds to the queue, so check-then-put cannot overshoot.
        if self._queue_size and self._queued >= self._queue_size:
            raise Rejected(f"queue full ({self._queued} waiting, --queue-size {self._queue_size})")
        loop = asyncio.get_running_loop()
        job = _Job(x=x, future=loop.create_future(), loop=loop)
        with self._count_lock:
            self._queued += 1
        self._queue.put(job)
        return await job.future

    # -- worker-thread side ---------------------------------------------------------------------
    def _worker(self) -> None:
        while True:
            batch = self._take_batch()
            if batch:
                self._run(batch)
            if batch is None:
                return

    def _take_batch(self) -> list[_Job] | None:
        """The next batch, or None when told to stop (possibly after a last partial batch)."""
        if self._batch_max == 1:
            job = self._queue.get()
            return None if job is _STOP else [self._dequeued(job)]  # type: ignore[arg-type]
        with self._collect_lock:
            first = self._queue.get()
            if first is _STOP:
                return None
            batch = [first]
            deadline = first.enqueued + self._batch_wait_s  # type: ignore[attr-defined]
            while len(batch) < self._batch_max:
                remaining = deadline - time.monotonic()
                try:
                    if remaining > 0:
                        job = self._queue.get(timeout=remaining)
                    else:
                        job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is _STOP:
                    self._queue.put(_STOP)  # leave it for this worker's next turn
                    break
                batch.append(job)
            return [self._dequeued(j) for j in batch]  # type: ignore[arg-type]

    def _take_session(self) -> Any:
        """The shared session; with a pool, a free one, or a new copy when none is free."""
        if self._make_session is None:
            return self._session
        with self._pool_lock:
            if self._free_sessions:
                return self._free_sessions.pop()
            self.sessions += 1
        self._metrics.faults.labels(kind="model_copy").inc()
        return self._make_session()

    def _give_session(self, session: Any) -> None:
        if self._make_session is not None:
            with self._pool_lock:
                self._free_sessions.append(session)

    def _dequeued(self, job: _Job) -> _Job:
        with self._count_lock:
            self._queued -= 1
            self._inflight += 1
        waited = time.monotonic() - job.enqueued
        self._metrics.queue_wait.observe(waited)
        self._metrics.nv_queue_us.inc(waited * 1e6)
        return job

    def _run(self, batch: list[_Job]) -> None:
        try:
            x = batch[0].x if len(batch) == 1 else np.concatenate([j.x for j in batch])
            session = self._take_session()
            started = time.perf_counter()
            try:
                out = session.run([OUTPUT_NAME], {INPUT_NAME: x})[0]
            finally:
                self._give_session(session)
            ran = time.perf_counter() - started
            self._metrics.inference_duration.observe(ran)
            self._metrics.nv_compute_us.inc(ran * 1e6)
            self._metrics.nv_exec.inc()
            self._metrics.batch_size.observe(x.shape[0])
            offset = 0
            results: list[tuple[_Job, Any, Exception | None]] = []
            for j in batch:
                rows = j.x.shape[0]
                results.append((j, out[offset : offset + rows], None))
                offset += rows
        except Exception as exc:  # a broken run fails its requests, not the worker
            logger.exception("inference failed for a batch of %d", len(batch))
            results = [(j, None, exc) for j in batch]
        finally:
            with self._count_lock:
                self._inflight -= len(batch)
        for job, result, error in results:
            try:
                job.loop.call_soon_threadsafe(_resolve, job.future, result, error)
            except RuntimeError:  # the loop has closed: the server is gone
                pass


class KneeEngine:
    """At most ``slots`` requests at once, each holding its slot for ``service_s`` seconds."""

    def __init__(
        self, metrics: TargetMetrics, slots: int, service_s: float, queue_size: int = 0,
        warmup: Warmup | None = None, jitter: Jitter | None = None,
    ) -> None:
        self._metrics = metrics
        self._slots_n = slots
        self._service_s = service_s
        self._queue_size = queue_size  # 0 = unbounded
        self._free: asyncio.Queue[float] | None = None  # holds, per free slot, when it freed
        self._warmup = warmup or Warmup()
        self._jitter = jitter or Jitter()
        self._waiting = 0
        self._inflight = 0
        metrics.track_queue_length(lambda: self._waiting)
        metrics.track_inflight(lambda: self._inflight)

    def start(self) -> None:
        self._free = asyncio.Queue()
        for _ in range(self._slots_n):
            self._free.put_nowait(float("-inf"))

    def stop(self) -> None:
        pass

    async def infer(self) -> None:
        assert self._free is not None, "start() the engine first"
        loop = asyncio.get_running_loop()
        arrived = loop.time()
        if self._queue_size and self._free.empty() and self._waiting >= self._queue_size:
            raise Rejected(f"queue full ({self._waiting} waiting, --queue-size {self._queue_size})")
        self._waiting += 1
        try:
            freed_at = await self._free.get()
        finally:
            self._waiting -= 1
        # Virtual clock: a request that waited starts exactly when its slot freed.
        start = max(arrived, freed_at)
        end = start + self._service_s * self._jitter.factor(start) + self._warmup.extra(start)
        self._metrics.queue_wait.observe(start - arrived)
        self._metrics.nv_queue_us.inc((start - arrived) * 1e6)
        self._metrics.nv_exec.inc()
        self._inflight += 1
        try:
            await asyncio.sleep(max(0.0, end - loop.time()))
        finally:
            self._inflight -= 1
            self._free.put_nowait(end)


def usl_service_s(n: int, service_s: float, sigma: float, kappa: float) -> float:
    """T·(1 + σ·(N − 1) + κ·N·(N − 1)): the time of a request that starts with ``n`` in service
    (itself included), so that N users in a closed loop get X(N) = N / that = the USL with λ = 1/T."""
    return service_s * (1.0 + sigma * (n - 1) + kappa * n * (n - 1))


def usl_efficiency_users(sigma: float, kappa: float, efficiency: float) -> float:
    """The N where the USL target's marginal efficiency 1 − N·d′(N)/d(N) (dX/dN over X/N, with
    d(N) = 1 + σ(N − 1) + κN(N − 1)) falls to ``efficiency``: bisection on the closed form, in [1, 1000].
    The knee a search over this target must find (tests, bench/search.py): its ground truth."""
    def eff(n: float) -> float:
        return 1 - n * (sigma + kappa * (2 * n - 1)) / (1 + sigma * (n - 1) + kappa * n * (n - 1))
    lo, hi = 1.0, 1000.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if eff(mid) >= efficiency else (lo, mid)
    return lo


def warmup_extra_s(since_first_s: float, warmup_s: float, extra_s: float) -> float:
    """The extra time of a request arriving ``since_first_s`` after the first one: ``extra_s`` at
    the first request, falling linearly to 0 at ``warmup_s`` (a cache or JIT warming up)."""
    if warmup_s <= 0 or extra_s <= 0 or since_first_s >= warmup_s:
        return 0.0
    return extra_s * (1.0 - max(since_first_s, 0.0) / warmup_s)


class Warmup:
    """``--warmup-s W --warmup-extra-ms X``: a drift in latency over the first W seconds of load,
    counted from the first inference request (not from start-up, so it is always seen by load)."""

    def __init__(self, warmup_s: float = 0.0, extra_s: float = 0.0) -> None:
        self._warmup_s, self._extra_s = warmup_s, extra_s
        self._first: float | None = None

    def extra(self, now: float) -> float:
        if self._first is None:
            self._first = now
        return warmup_extra_s(now - self._first, self._warmup_s, self._extra_s)


class UslEngine:
    """Every request is served at once (no slots, no queue), taking ``usl_service_s(N)`` seconds
    where N is the number in service when it starts, itself included; it sleeps, burns no CPU.

    N is sampled at the start and the request's time fixed then, rather than integrated as N
    changes while it runs (processor-sharing style): in a closed loop with no think time every
    user's request is in service all the time but for the client's turn-around, so the N a request
    starts with IS the number of users, and X(N) = N / (T·(1 + σ(N−1) + κN(N−1))) — the Universal
    Scalability Law exactly, λ = 1/T, peak at N* = √((1−σ)/κ), retrograde past it.  Integrating
    would give the same in that steady state but make one request's time depend on requests that
    arrive after it; the sample at the start keeps each request's time a closed form (a test checks
    it) and independent of event-loop jitter beyond one sleep's overshoot.
    """

    def __init__(self, metrics: TargetMetrics, service_s: float, sigma: float, kappa: float,
                 warmup: Warmup | None = None, jitter: Jitter | None = None) -> None:
        self._metrics = metrics
        self._service_s, self._sigma, self._kappa = service_s, sigma, kappa
        self._warmup = warmup or Warmup()
        self._jitter = jitter or Jitter()
        self._inflight = 0
        metrics.track_queue_length(lambda: 0)
        metrics.track_inflight(lambda: self._inflight)

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    async def infer(self) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        self._inflight += 1
        hold = usl_service_s(self._inflight, self._service_s, self._sigma, self._kappa) * self._jitter.factor(start)
        hold += self._warmup.extra(start)
        self._metrics.queue_wait.observe(0.0)
        self._metrics.nv_exec.inc()
        try:
            await asyncio.sleep(max(0.0, start + hold - loop.time()))
        finally:
            self._inflight -= 1

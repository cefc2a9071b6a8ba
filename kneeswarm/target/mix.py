"""Several models of different cost in one demo target (``--mode knee --models cheap:5,slow:40``).

The ground truth of a traffic mix: each model is served under its own name (KServe v2
``/v2/models/{name}/infer``) and takes its own service time (ms), sleeping, no CPU work.  Where
requests wait is the point:

* ``NAME:MS`` models share the server's ``--slots`` slots (one device: a GPU serving several
  models, an LLM server its base model and adapters), taken in arrival order (FIFO): every
  class waits the same, the fair default.
* ``--priority NAME[,NAME...]``: the shared queue serves those models' requests first (FIFO
  among them), the others only when none of theirs waits -- a scheduler built to starve a class.
* ``NAME:MS:SLOTS``: the model has SLOTS instances of its own (Triton's ``instance_group`` per
  model) and its own FIFO queue: it waits for no other model, and no other model for it.

Slot times are kept on a virtual clock, as in ``KneeEngine``: a request that waited starts
exactly when its slot freed.  Triton's per-model counters (``nv_inference_request_success``,
``nv_inference_exec_count``, ``nv_inference_queue_duration_us`` labelled ``{model, version}``)
count each model apart, the record a load test's per-class counts are checked against.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import re
from dataclasses import dataclass

from kneeswarm.target.engine import Rejected, Warmup
from kneeswarm.target.jitter import Jitter
from kneeswarm.target.metrics import TargetMetrics

logger = logging.getLogger(__name__)

_MODEL = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*):([0-9]*\.?[0-9]+)(?::([0-9]+))?$")
PRIORITY_FIRST, PRIORITY_REST = 0, 1  # ranks in the shared queue: --priority models first


@dataclass(frozen=True)
class ModelCost:
    name: str
    service_ms: float
    slots: int | None = None  # instances of its own; None: the server's shared --slots


def parse_models(text: str) -> list[ModelCost]:
    """``cheap:5,slow:40[:SLOTS]`` -> ModelCost list; ValueError (one line) otherwise."""
    out: list[ModelCost] = []
    for part in text.split(","):
        m = _MODEL.match(part.strip())
        if not m or float(m.group(2)) <= 0 or (m.group(3) is not None and int(m.group(3)) < 1):
            raise ValueError(f"{part.strip()!r} is not NAME:SERVICE_MS[:SLOTS] (service ms > 0, slots >= 1)")
        out.append(ModelCost(m.group(1), float(m.group(2)), int(m.group(3)) if m.group(3) else None))
    names = [c.name for c in out]
    if len(set(names)) != len(names):
        raise ValueError(f"a model is named twice in {text!r}")
    return out


class SlotPool:
    """``slots`` slots on a virtual clock; waiters ordered by (rank, arrival)."""

    def __init__(self, slots: int) -> None:
        self.free: list[float] = [float("-inf")] * slots  # per free slot, when it freed
        self.waiting: list[tuple[int, int, asyncio.Future[float]]] = []
        self._seq = itertools.count()

    async def acquire(self, rank: int) -> float:
        """When the slot this request gets freed (its start is max(arrival, that))."""
        if self.free and not self.waiting:
            return self.free.pop()
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        heapq.heappush(self.waiting, (rank, next(self._seq), fut))
        try:
            return await fut
        except asyncio.CancelledError:  # the client went away: a slot handed to it is handed on
            if fut.done() and not fut.cancelled():
                self.release(fut.result())
            raise

    def release(self, freed_at: float) -> None:
        while self.waiting:
            _rank, _seq, fut = heapq.heappop(self.waiting)
            if not fut.done():
                fut.set_result(freed_at)
                return
        self.free.append(freed_at)


class MixEngine:
    """The models of ``--models``: each request holds a slot of its model's pool for its service time."""

    def __init__(self, metrics: TargetMetrics, models: list[ModelCost], shared_slots: int, priority: tuple[str, ...] = (),
                 queue_size: int = 0, warmup: Warmup | None = None, jitter: Jitter | None = None) -> None:
        self._metrics = metrics
        self.models = {m.name: m for m in models}
        shared = SlotPool(shared_slots)
        self._pools = {m.name: SlotPool(m.slots) if m.slots else shared for m in models}
        self._rank = {m.name: PRIORITY_FIRST if m.name in priority else PRIORITY_REST for m in models}
        self._queue_size = queue_size
        self._warmup = warmup or Warmup()
        self._jitter = jitter or Jitter()
        self._waiting = 0
        self._inflight = 0
        metrics.track_queue_length(lambda: self._waiting)
        metrics.track_inflight(lambda: self._inflight)

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    async def infer(self, model: str) -> None:
        loop = asyncio.get_running_loop()
        arrived = loop.time()
        pool = self._pools[model]
        if self._queue_size and not pool.free and len(pool.waiting) >= self._queue_size:
            raise Rejected(f"queue full ({len(pool.waiting)} waiting, --queue-size {self._queue_size})")
        self._waiting += 1
        try:
            freed_at = await pool.acquire(self._rank[model])
        finally:
            self._waiting -= 1
        start = max(arrived, freed_at)
        end = start + self.models[model].service_ms / 1000.0 * self._jitter.factor(start) + self._warmup.extra(start)
        counters = self._metrics.triton(model)
        self._metrics.queue_wait.observe(start - arrived)
        counters.queue_us.inc((start - arrived) * 1e6)
        counters.exec.inc()
        self._inflight += 1
        try:
            await asyncio.sleep(max(0.0, end - loop.time()))
        finally:
            self._inflight -= 1
            pool.release(end)

"""The per-request recorder: every request becomes one row of the run directory's schema.

Worker side (``RowBuffer``): a ``request`` event listener appends a tuple per request; the
rows ride to the master on Locust's own worker->master report (``report_to_master``, every
``locust.runners.WORKER_REPORT_INTERVAL`` seconds), so no shared disk is needed.

Master side (``RequestWriter``): rows from every worker (or from this process in local
mode) are stamped with the step they belong to and appended to requests/part-*.parquet
every ``FLUSH_INTERVAL`` seconds, so a crash loses at most the last few seconds.

The listener is the hot path: it does a tuple append and nothing else for a success.
"""

from __future__ import annotations

import errno
import logging
import socket
import time
from typing import Any, Callable

import numpy as np

from kneeswarm.rundir import RunDir

from locustfiles.protocols.base import BadPayload

logger = logging.getLogger(__name__)

FLUSH_INTERVAL = 2.0  # seconds between part files on the master
REPORT_KEY = "kneeswarm_rows"  # key in the worker report (Locust reserves "stats" and "errors")
GEN_KEY = "kneeswarm_gen"

# Column order of a row tuple as it travels (worker and step are added on the master).
WIRE_COLUMNS = ("t_start", "latency_ms", "bytes", "ok", "status", "error", "name", "tokens_in", "tokens_out", "ttft_ms")


def categorize(status: int, exception: BaseException | None) -> str | None:
    """Map a failed request to an error category of the run-directory contract."""
    if exception is None and (status < 400):
        return None
    category = getattr(exception, "category", None)  # BadPayload, StreamTruncated name their own
    if isinstance(category, str):
        return category
    if status == 429:
        return "http_429"  # pushback: a saturation signal, kept apart from other 4xx
    if 400 <= status < 500:
        return "http_4xx"
    if status >= 500:
        return "http_5xx"
    if isinstance(exception, BadPayload):
        return "bad_payload"
    name = type(exception).__name__.lower()
    text = str(exception).lower()
    if isinstance(exception, (TimeoutError, socket.timeout)) or "timeout" in name or "timed out" in text:
        return "timeout"
    if isinstance(exception, ConnectionRefusedError) or getattr(exception, "errno", None) == errno.ECONNREFUSED:
        return "conn_refused"
    if "refused" in text:
        return "conn_refused"
    if isinstance(exception, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)) or "reset" in text:
        return "conn_reset"
    if "connection closed" in text or "remotedisconnected" in name or "eof" in text:
        return "conn_reset"
    return "other"


Columns = dict[str, list]  # one list per WIRE_COLUMNS entry, all of the same length


def empty_columns() -> Columns:
    return {c: [] for c in WIRE_COLUMNS}


class RowBuffer:
    """Collects request rows in this process, column by column, until they are taken.

    Columns rather than a tuple per request: appending floats and ints to lists allocates no
    object the cyclic garbage collector tracks, while a tuple per request made the collector
    cost ~8% of the generator's throughput (measured with bench/generator.py, gc on vs off).
    """

    def __init__(self) -> None:
        self._reset()
        self.count = 0

    def _reset(self) -> None:
        self._cols = empty_columns()
        # Bound appends in WIRE_COLUMNS order: the hot path does no dict lookups.
        (self._t, self._lat, self._bytes, self._ok, self._status, self._error, self._name,
         self._tin, self._tout, self._ttft) = (self._cols[c].append for c in WIRE_COLUMNS)

    def on_request(
        self,
        request_type: str,
        name: str,
        response_time: float,
        response_length: int,
        response: Any = None,
        context: dict | None = None,
        exception: BaseException | None = None,
        start_time: float | None = None,
        **_kw: Any,
    ) -> None:
        status = getattr(response, "status_code", 0) or 0
        self._t(start_time or (time.time() - response_time / 1000.0))
        self._lat(response_time)
        self._bytes(response_length)
        self._ok(exception is None)
        self._status(status)
        self._error(None if exception is None else categorize(status, exception))
        self._name(name)
        extra = context.get("kneeswarm") if context else None  # (tokens_in, tokens_out, ttft_ms)
        tin, tout, ttft = extra or (None, None, None)
        self._tin(tin)
        self._tout(tout)
        self._ttft(ttft)
        self.count += 1

    def take(self) -> Columns:
        """The rows so far (and a fresh, empty buffer). No lock: greenlets do not preempt."""
        cols = self._cols
        self._reset()
        return cols


class RequestWriter:
    """Stamps rows with their step and writes them as parquet parts (master or local runner)."""

    def __init__(self, run: RunDir, step_starts: Callable[[], list[tuple[float, int]]]):
        self.run = run
        self._step_starts = step_starts  # [(t_ramp, users)] of the steps begun so far
        self._pending: list[tuple[str, Columns, float]] = []
        self._seq = len(run.request_parts())
        self.rows_written = 0

    def add(self, worker: str, cols: Columns | None, clock_offset: float = 0.0) -> None:
        """Queue a worker's rows; ``clock_offset`` (worker minus master, seconds) is taken off t_start."""
        if cols and cols.get("t_start"):
            self._pending.append((worker, cols, clock_offset))

    def flush(self) -> int:
        batches, self._pending = self._pending, []
        if not batches:
            return 0
        merged = empty_columns()
        for _, cols, _ in batches:
            for c in WIRE_COLUMNS:
                merged[c].extend(cols.get(c) or [None] * len(cols["t_start"]))
        n = len(merged["t_start"])
        sizes = [len(cols["t_start"]) for _, cols, _ in batches]
        t_start = np.asarray(merged["t_start"], dtype=float) - np.repeat([off for _, _, off in batches], sizes)
        starts = self._step_starts()
        t_ramps = np.array([t for t, _ in starts], dtype=float)
        step = np.searchsorted(t_ramps, t_start, side="right") - 1
        users = np.array([u for _, u in starts] + [0], dtype=np.int32)  # index -1 (before any step) -> 0
        out: dict[str, Any] = dict(merged)
        out["t_start"] = t_start
        out["step"] = step.astype(np.int32)
        out["users"] = users[step]
        out["worker"] = [w for (w, _, _), k in zip(batches, sizes) for _ in range(k)]
        self.run.write_request_part(out, self._seq)
        self._seq += 1
        self.rows_written += n
        return n


class GeneratorSampler:
    """1 Hz self-metrics of this load-generator process: CPU%, RSS, users, event-loop lag."""

    LAG_PROBE = 0.1  # seconds the lag probe sleeps; the overshoot is the loop's lag

    def __init__(self, user_count: Callable[[], int]):
        import psutil

        self._proc = psutil.Process()
        self._proc.cpu_percent(None)
        self._user_count = user_count
        self._samples: list[tuple] = []
        self._max_lag = 0.0

    def run_forever(self) -> None:
        """The sampling loop, for a greenlet of its own: one sample a second. A short sleep that
        overshoots measures the event loop's lag (how late greenlets, and so requests, run)."""
        import gevent  # here, not at the top: recorder.py stays importable without Locust's gevent

        while True:
            t0 = time.perf_counter()
            gevent.sleep(self.LAG_PROBE)
            self._max_lag = max(self._max_lag, (time.perf_counter() - t0 - self.LAG_PROBE) * 1000.0)
            gevent.sleep(1.0 - self.LAG_PROBE)
            self.sample()

    def sample(self) -> None:
        rss = self._proc.memory_info().rss / 1e6
        self._samples.append((round(time.time(), 3), self._proc.cpu_percent(None), round(rss, 1), self._user_count(), round(self._max_lag, 2)))
        self._max_lag = 0.0

    def take(self) -> list[tuple]:
        s, self._samples = self._samples, []
        return s

"""The per-request recorder: every request becomes one row of the run directory's schema.

Worker side (``RowBuffer``): a ``request`` event listener appends each request's values to
one list per column; the columns ride to the master on Locust's own worker->master report
(``report_to_master``, every ``locust.runners.WORKER_REPORT_INTERVAL`` seconds), so no shared
disk is needed.

Master side (``RequestWriter``): rows from every worker (already on the master's clock, see
clocks.ClockGate) or from this process in local mode are stamped with the step they belong
to and appended to requests/part-*.parquet every ``FLUSH_INTERVAL`` seconds, so a crash loses
at most the last few seconds.

The listener is the hot path: five list appends and two tests for a plain success.
"""

from __future__ import annotations

import errno
import logging
import socket
import time
from typing import Any, Callable, Final, TypedDict

import numpy as np

from kneeswarm.contracts import rundir
from kneeswarm.contracts.rundir import RunDir

from kneeswarm.locustfiles.protocols.base import REQUEST_NAME, BadPayload, request_name

logger = logging.getLogger(__name__)

FLUSH_INTERVAL = 2.0  # seconds between part files on the master
MAX_HELD_ROWS = 200_000  # rows kept for a retry while parts cannot be written (~1 min at 3k req/s)
REPORT_KEY: Final = "kneeswarm_rows"  # key in the worker report (Locust reserves "stats" and "errors")
GEN_KEY: Final = "kneeswarm_gen"
#: generator/<this>: what the master's recording received, wrote and lost, and its warnings
#: (the conductor merges "lost" and "warnings" into meta.json)
RECORDER_FILE = rundir.RECORDER_FILE  # generator/recorder.json (kneeswarm.contracts.rundir names the files)

# The columns of a row as it travels, one list each (worker and step are added on the master).
# A streamed answer adds its gaps between text chunks, whether tokens_out was counted by the client, the
# server's count, the chunks, and the independent counts (users.StreamInfo); None for every other request.
WIRE_COLUMNS = ("t_start", "latency_ms", "bytes", "ok", "status", "error", "name", "tokens_in", "tokens_out", "ttft_ms",
                "itl_ms", "tokens_counted", "usage_out", "chunks_out", "tokens_tokenizer", "tokens_pinned",
                "prefix", "turn", "resent", "class")
STREAM_COLUMNS = WIRE_COLUMNS[10:16]  # users.StreamInfo's fields, in order
TAG_COLUMNS = ("prefix", "turn", "class")  # context["kneeswarm_tags"]: the LLM workload's (prefix, turn), the mix's class


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
#: What a worker adds to Locust's report to the master (report_to_master, every
#: WORKER_REPORT_INTERVAL): its request rows since the last report (RowBuffer.take), its self-metrics
#: samples (GeneratorSampler.take: (t, cpu_pct, rss_mb, users, lag_ms) tuples,
#: rundir.GENERATOR_COLUMNS) and its row watermark (watermark.InFlight: every row not in this report
#: or an earlier one starts at or after it), on the worker's clock.
WorkerReport = TypedDict("WorkerReport", {"kneeswarm_rows": Columns, "kneeswarm_gen": list[tuple],
                                          "kneeswarm_wm": float}, total=False)


def empty_columns() -> Columns:
    return {c: [] for c in WIRE_COLUMNS}


class RowBuffer:
    """Collects request rows in this process, column by column, until they are taken.

    Columns rather than a tuple per request: appending floats and ints to lists allocates no
    object the cyclic garbage collector tracks, while a tuple per request made the collector
    cost ~8% of the generator's throughput (measured with bench/generator.py, gc on vs off).

    The hot path appends only what every request has (start, latency, bytes, status, name).
    What most requests lack -- a failure, token counts, a streamed answer's gaps -- is kept
    sparse, as (row, ...) entries, and spread into full columns by ``take`` (every report,
    at C speed): a plain success costs five list appends and two tests.
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._t_list: list[float] = []
        self._lat_list: list[float] = []
        self._bytes_list: list[int] = []
        self._status_list: list[int] = []
        self._name_list: list[str] = []
        self._t, self._lat, self._bytes = self._t_list.append, self._lat_list.append, self._bytes_list.append
        self._status, self._name = self._status_list.append, self._name_list.append
        self._failed: list[tuple[int, str | None]] = []  # (row, error category)
        self._tokens: list[tuple[int, tuple]] = []  # (row, (tokens_in, tokens_out, ttft_ms))
        self._streams: list[tuple[int, tuple]] = []  # (row, users.StreamInfo)
        self._tags: list[tuple[int, tuple]] = []  # (row, (prefix, turn, class))
        self._resent: list[tuple[int, tuple]] = []  # (row, (times sent again,))

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
        self._status(status)
        self._name(name)
        if exception is not None:
            self._failed.append((len(self._t_list) - 1, categorize(status, exception)))
        if context:
            extra = context.get("kneeswarm")  # (tokens_in, tokens_out, ttft_ms)
            if extra:
                self._tokens.append((len(self._t_list) - 1, extra))
            stream = context.get("kneeswarm_stream")  # users.StreamInfo(itl_ms, tokens_counted, usage_out, chunks, ...)
            if stream:
                self._streams.append((len(self._t_list) - 1, stream))
            tags = context.get("kneeswarm_tags")  # (prefix, turn) of an LLM workload's request, its class in a mix
            if tags:
                self._tags.append((len(self._t_list) - 1, tags))
                if tags[2] is not None and name == request_name(tags[2]):  # Locust's name per class; the row's is the request's
                    self._name_list[-1] = REQUEST_NAME
            resent = context.get("kneeswarm_resent")  # users: sent again after a clean close
            if resent:
                self._resent.append((len(self._t_list) - 1, (resent,)))

    def take(self) -> Columns:
        """The rows so far as full columns (and a fresh, empty buffer). No lock: greenlets do not preempt."""
        n = len(self._t_list)
        cols: Columns = {"t_start": self._t_list, "latency_ms": self._lat_list, "bytes": self._bytes_list,
                         "ok": [True] * n, "status": self._status_list, "error": [None] * n, "name": self._name_list}
        for c in WIRE_COLUMNS[7:]:
            cols[c] = [None] * n
        for i, category in self._failed:
            cols["ok"][i] = False
            cols["error"][i] = category
        _spread(cols, self._tokens, ("tokens_in", "tokens_out", "ttft_ms"))
        _spread(cols, self._streams, STREAM_COLUMNS)
        _spread(cols, self._tags, TAG_COLUMNS)
        _spread(cols, self._resent, ("resent",))
        self._reset()
        return cols


def _spread(cols: Columns, sparse: list[tuple[int, tuple]], names: tuple[str, ...]) -> None:
    """Write each (row, values) entry's values into the named columns at that row."""
    targets = [cols[c] for c in names]
    for i, values in sparse:
        for col, v in zip(targets, values):
            col[i] = v


class RequestWriter:
    """Stamps rows with their step and writes them as parquet parts (master or local runner).

    A part that cannot be written (a full disk) does not lose its rows: they are held and
    retried with the next flush, up to MAX_HELD_ROWS; beyond that the oldest are dropped, and
    every dropped row is counted (``rows_lost``, reported in meta.json["lost"]).
    """

    def __init__(self, run: RunDir, step_starts: Callable[[], list[tuple[float, int]]]):
        self.run = run
        self._step_starts = step_starts  # [(t_ramp, users)] of the steps begun so far
        self._pending: list[tuple[str, Columns]] = []
        self._held: dict[str, Any] | None = None  # stamped rows whose write failed, retried next flush
        self._seq = len(run.request_parts())
        self.rows_received = 0
        self.rows_written = 0
        self.rows_lost = 0
        self.failed_writes = 0
        self.last_error = ""

    def add(self, worker: str, cols: Columns | None) -> None:
        """Queue a worker's rows (their t_start on the master's clock)."""
        if cols and cols.get("t_start"):
            self._pending.append((worker, cols))
            self.rows_received += len(cols["t_start"])

    def flush(self) -> int:
        """Write what was added (and what an earlier flush could not write) as one part; returns
        the rows written. Never raises for a failed write: the rows are held or counted lost."""
        batches, self._pending = self._pending, []
        rows = _concat(self._held, self._stamp(batches) if batches else None)
        self._held = None
        if rows is None:
            return 0
        n = len(rows["t_start"])
        try:
            self.run.write_request_part(rows, self._seq)
        except OSError as e:  # a full disk: keep the rows for the next flush
            self.failed_writes += 1
            self.last_error = _one_line(e)
            self._hold(rows)
            return 0
        except Exception as e:  # noqa: BLE001 - rows pyarrow refuses: a retry would not help
            self.last_error = _one_line(e)
            self.rows_lost += n
            logger.error("kneeswarm: %d request rows could not be written: %s", n, self.last_error)
            return 0
        self._seq += 1
        self.rows_written += n
        return n

    def abandon(self) -> int:
        """The recording is over: rows still held (their last write failed) are lost; returns them."""
        n = len(self._held["t_start"]) if self._held else 0
        self._held = None
        self.rows_lost += n
        return n

    @property
    def rows_held(self) -> int:
        return len(self._held["t_start"]) if self._held else 0

    def _hold(self, rows: dict[str, Any]) -> None:
        n = len(rows["t_start"])
        excess = max(0, n - MAX_HELD_ROWS)
        if excess:  # the oldest go first; the newest are kept for the retry
            rows = {c: v[excess:] for c, v in rows.items()}
            self.rows_lost += excess
        self._held = rows
        logger.error("kneeswarm: could not write request rows (%s); %d held for the next flush, %d lost so far",
                     self.last_error, n - excess, self.rows_lost)

    def _stamp(self, batches: list[tuple[str, Columns]]) -> dict[str, Any]:
        """One batch of columns, with each row's step, users and worker."""
        merged = empty_columns()
        for _, cols in batches:
            for c in WIRE_COLUMNS:
                merged[c].extend(cols.get(c) or [None] * len(cols["t_start"]))
        sizes = [len(cols["t_start"]) for _, cols in batches]
        t_start = np.asarray(merged["t_start"], dtype=float)
        starts = self._step_starts()
        t_ramps = np.array([t for t, _ in starts], dtype=float)
        step = np.searchsorted(t_ramps, t_start, side="right") - 1
        users = np.array([u for _, u in starts] + [0], dtype=np.int32)  # index -1 (before any step) -> 0
        out: dict[str, Any] = dict(merged)
        out["t_start"] = t_start
        out["step"] = step.astype(np.int32)
        out["users"] = users[step]
        out["worker"] = [w for (w, _), k in zip(batches, sizes) for _ in range(k)]
        return out


def _concat(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any] | None:
    """Two column dicts (lists or numpy arrays) as one; either may be None."""
    if a is None or b is None:
        return a if b is None else b
    return {c: np.concatenate([a[c], b[c]]) if isinstance(a[c], np.ndarray) else [*a[c], *b[c]] for c in a}


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


class CpuCeiling:
    """The cores this process may use, at most one: its cgroup's CPU quota (the tightest of its
    levels, v1 or v2, read as the host agent reads it: agents/remote/cgroup.py) where that is less
    than a core, else 1 (a gevent worker is one event loop: one core is all it can use).

    A worker held to 0.2 core by a cgroup quota was the bottleneck at 19 % CPU of a core (1,572
    QPS at 32 users, ~3,000 unconfined), so "CPU of one core > 90 %" never saw it.  Read at every
    sample: a process moved into a cgroup, or a quota changed, counts from then on.
    """

    def __init__(self) -> None:
        import os
        import threading

        from kneeswarm.agents.remote.cgroup import CgroupSampler

        self._reader = CgroupSampler("cgroup", os.devnull, 1.0, threading.Event(), os.getpid())
        self._reader.setup()  # reads /proc/self/mountinfo; nothing where there is none (not Linux)

    def cores(self) -> float:
        from kneeswarm.agents.remote.cgroup import cgroup_paths
        from kneeswarm.agents.remote.files import read_text

        row: dict[str, Any] = {}
        try:
            self._reader.read(cgroup_paths(read_text(self._reader.cgroup_file)), row)
        except OSError:
            return 1.0
        quota, period = row.get("quota_us"), row.get("period_us")
        return min(1.0, quota / period) if quota and period else 1.0


class GeneratorSampler:
    """1 Hz self-metrics of this load-generator process: CPU%, RSS, users, event-loop lag.

    ``cpu_pct`` is the process's CPU time (all its threads, psutil: the kernel's utime + stime)
    as a % of what it may use (CpuCeiling: one core, or its cgroup's quota when less), so
    near 100 means the generator itself is the bottleneck however it is confined."""

    LAG_PROBE = 0.1  # seconds the lag probe sleeps; the overshoot is the loop's lag

    def __init__(self, user_count: Callable[[], int]):
        import psutil

        self._proc = psutil.Process()
        self._proc.cpu_percent(None)
        self._ceiling = CpuCeiling()
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
        cpu = self._proc.cpu_percent(None) / self._ceiling.cores()
        self._samples.append((round(time.time(), 3), round(cpu, 1), round(rss, 1), self._user_count(), round(self._max_lag, 2)))
        self._max_lag = 0.0

    def take(self) -> list[tuple]:
        s, self._samples = self._samples, []
        return s

"""One pass over the request rows: per-step statistics, totals and the per-second timeline,
without holding the run's rows in memory.

The parts (requests/part-*.parquet) are read one at a time, in the order of their first
``t_start`` (from each footer's statistics), and only the columns analysis uses
(``READ_COLUMNS``).  Each part's rows are routed to the steps whose steady window they fall in.
A step keeps its successful latencies only until no part still to be read can hold rows of its
window: every part left starts at or after the *frontier* (the smallest first ``t_start`` of
the parts left), so a window that ends at or before the frontier is complete, is reduced to its
statistics (numpy percentiles, as before) and freed.  The timeline is binned by completion time
in the same way: a bin that ends at or before the frontier is closed (a request completes after
it starts).  Memory thus follows the largest step and the overlap between parts, not the run.

A step whose end was not recorded and that has no next step (a crash in the last step) ends at
the last completion, known only at the end: its rows are kept until then (``open`` windows).

Streamed LLM answers (kneeswarm.analysis.measure.streaming): the streaming columns (``ttft_ms``, ``itl_ms`` ...) are
read only from parts whose footer says some row has a ``ttft_ms`` or ``chunks_out`` (``Part.streamed``), so a run
without streaming reads what it read before; each step reduces its streaming rows to TTFT/ITL/TPOT percentiles,
tokens/s, token-count agreement and goodput (against the plan's ``[sla]``) as it closes.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kneeswarm.analysis.measure.streaming import (STREAM_COLUMNS, STEP_KEYS as STREAM_STEP_KEYS, StreamAcc, StreamRows, goodput_limits)
from kneeswarm.analysis.measure.resample import BLOCKS_KEY, BlockSample
from kneeswarm.analysis.measure.windows import resolve_windows
from kneeswarm.contracts.rundir import (REQUEST_SCHEMA, RunDir, UnreadablePart, footer_range, safe_name, unreadable_part)

logger = logging.getLogger(__name__)

READ_COLUMNS = ("t_start", "latency_ms", "ok", "error", "step", "worker", "tokens_out", "resent")
PERCENTILES = {"p50_ms": 50.0, "p95_ms": 95.0, "p99_ms": 99.0, "p999_ms": 99.9}
OTHER_ERROR = "other"  # a failure without a category
BAD_LATENCY_ERROR = "bad_latency"  # a row marked ok whose latency is not a finite number >= 0
BIN_S = 1.0  # timeline resolution in seconds ...
TIMELINE_MAX_BINS = 7200  # ... widened (2 s, 3 s, ...) beyond this many bins, so the report stays light
TIMELINE_QUANTILE = 0.99


# -- one chunk of rows ----------------------------------------------------------------------
@dataclass
class Chunk:
    """The columns of some rows that analysis reads, as numpy arrays."""

    t: np.ndarray
    lat: np.ndarray
    ok: np.ndarray  # a success: marked ok with a finite latency >= 0
    err: np.ndarray  # object: the category of each failure (None for successes)
    step: np.ndarray  # float, NaN where the recorder did not stamp one
    tokens: np.ndarray  # float: output tokens, NaN where not recorded (not an LLM run)
    wcode: np.ndarray  # int: index into ``wnames`` of each row's worker, -1 where none
    wnames: list = field(default_factory=list)
    llm: StreamRows | None = None  # the streaming columns, when some row streamed
    resent: np.ndarray | None = None  # float: times each request was sent again (NaN: once), when recorded

    @classmethod
    def of(cls, df: pd.DataFrame) -> Chunk:
        """From rows in a DataFrame (any of READ_COLUMNS may be missing)."""
        n = len(df)
        col = lambda c: df[c] if c in df.columns else pd.Series([None] * n, dtype=object)  # noqa: E731
        t = pd.to_numeric(col("t_start"), errors="coerce").to_numpy(dtype=float)
        lat = pd.to_numeric(col("latency_ms"), errors="coerce").to_numpy(dtype=float)
        marked = np.asarray(col("ok").to_numpy() == True, dtype=bool)  # noqa: E712 (None is not ok)
        step = pd.to_numeric(col("step"), errors="coerce").to_numpy(dtype=float)
        tokens = pd.to_numeric(col("tokens_out"), errors="coerce").to_numpy(dtype=float)
        codes, names = pd.factorize(col("worker"), use_na_sentinel=True)
        c = cls._build(t, lat, marked, lambda failed: col("error").to_numpy()[failed], step, tokens, codes,
                       list(names), StreamRows.of_frame(df))
        c.resent = pd.to_numeric(col("resent"), errors="coerce").to_numpy(dtype=float)
        return c

    @classmethod
    def of_table(cls, table: pa.Table, llm: StreamRows | None = None) -> Chunk:
        """From an Arrow table of a part, without Python objects for its successful rows; ``llm``:
        its streaming columns (StreamRows.of_table), when some row streamed."""
        n = table.num_rows
        col = lambda c: table.column(c) if c in table.column_names else pa.nulls(n)  # noqa: E731
        num = lambda c: pc.cast(col(c), pa.float64()).to_numpy(zero_copy_only=False)  # noqa: E731 (null -> NaN)
        marked = pc.fill_null(pc.cast(col("ok"), pa.bool_()), False).to_numpy(zero_copy_only=False)
        worker = pc.dictionary_encode(pc.cast(col("worker"), pa.string())).combine_chunks()
        codes = pc.fill_null(worker.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
        errors = lambda failed: np.asarray(pc.filter(col("error"), pa.array(failed)).to_pylist(), dtype=object)  # noqa: E731
        c = cls._build(num("t_start"), num("latency_ms"), marked, errors, num("step"), num("tokens_out"), codes,
                       worker.dictionary.to_pylist(), llm)
        c.resent = num("resent")
        return c

    @classmethod
    def _build(cls, t: np.ndarray, lat: np.ndarray, marked: np.ndarray, errors_of, step: np.ndarray,
               tokens: np.ndarray, codes: np.ndarray, names: list, llm: StreamRows | None = None) -> Chunk:
        """``errors_of(mask)``: the recorded error of the rows in ``mask``."""
        with np.errstate(invalid="ignore"):
            good = np.isfinite(lat) & (lat >= 0)
        ok = marked & good
        err = np.full(len(t), None, dtype=object)
        failed = ~ok
        if failed.any():
            rec = np.asarray(errors_of(failed), dtype=object)
            err[failed] = np.where(pd.isna(rec), OTHER_ERROR, rec)
            err[marked & ~good] = BAD_LATENCY_ERROR
        return cls(t, lat, ok, err, step, tokens, np.asarray(codes, dtype=np.int64), names, llm)

    def done(self) -> np.ndarray:
        """Completion times: t_start + latency (t_start without a usable latency)."""
        with np.errstate(invalid="ignore"):
            return self.t + np.where(np.isfinite(self.lat) & (self.lat >= 0), self.lat, 0.0) / 1000.0

    def take(self, mask: np.ndarray) -> Chunk:
        return Chunk(self.t[mask], self.lat[mask], self.ok[mask], self.err[mask], self.step[mask], self.tokens[mask],
                     self.wcode[mask], self.wnames, None if self.llm is None else self.llm.take(mask),
                     None if self.resent is None else self.resent[mask])

    def workers(self) -> set[str]:
        """The generator-CSV names (rundir.safe_name) of the workers of these rows."""
        return {safe_name(str(self.wnames[i])) for i in np.unique(self.wcode) if i >= 0}


# -- one step ---------------------------------------------------------------------------------
@dataclass
class StepAcc:
    """The rows of one steady window, reduced as they come (latencies kept until the window closes)."""

    index: float
    t_lo: float
    t_hi: float  # +inf for an open window (see the module docstring)
    n: int = 0
    n_ok: int = 0
    foreign: int = 0
    resent: int = 0  # requests sent again after a clean close of a kept-alive connection (users.py)
    busy_s: float = 0.0  # request-seconds in flight inside the window, from every row that overlaps it
    tokens_out: float = math.nan  # output tokens of the successful rows (NaN: none recorded)
    lat: list[np.ndarray] = field(default_factory=list)
    t_ok: list[np.ndarray] = field(default_factory=list)  # the successful rows' starts (for the blocks)
    errors: Counter = field(default_factory=Counter)
    workers: set[str] = field(default_factory=set)
    pending: list[Chunk] = field(default_factory=list)  # rows of an open window, filtered at the end
    result: dict | None = None
    stream: StreamAcc = field(default_factory=StreamAcc)  # streaming rows and goodput (kneeswarm.analysis.measure.streaming)

    @property
    def usable(self) -> bool:
        return math.isfinite(self.t_lo) and self.t_hi > self.t_lo

    def route(self, c: Chunk) -> None:
        """Take this window's rows of a chunk (rows stamped with another step are counted, left out)."""
        inside = (c.t >= self.t_lo) & (c.t < self.t_hi)
        if not inside.any():
            return
        mine = inside & (np.isnan(c.step) | (c.step == self.index))
        self.foreign += int(inside.sum() - mine.sum())
        if mine.any():
            rows = c.take(mine)
            if math.isinf(self.t_hi):
                self.pending.append(rows)
            else:
                self.add(rows)

    def overlap(self, c: Chunk, done: np.ndarray) -> None:
        """Add the time each row of a chunk was in flight inside the window (``done``: c.done()).

        Every row counts, whichever step stamped it and whenever it started: a request that began
        before the window or ended after it kept a user busy for the part inside.  Divided by the
        window, this is the time-average number in flight, the L of Little's law measured directly
        (an open window ends at the last completion, so it clips nothing at its end)."""
        if not len(c.t) or np.nanmax(done, initial=-math.inf) <= self.t_lo or np.nanmin(c.t, initial=math.inf) >= self.t_hi:
            return  # the chunk's rows all end before the window or start after it
        with np.errstate(invalid="ignore"):
            inside = np.minimum(done, self.t_hi) - np.maximum(c.t, self.t_lo)
        self.busy_s += float(inside[np.isfinite(inside) & (inside > 0)].sum())

    def add(self, c: Chunk) -> None:
        self.n += len(c.t)
        self.n_ok += int(c.ok.sum())
        tokens = c.tokens[c.ok]
        tokens = tokens[np.isfinite(tokens)]
        if len(tokens):
            self.tokens_out = float(tokens.sum()) + (0.0 if math.isnan(self.tokens_out) else self.tokens_out)
        self.lat.append(c.lat[c.ok])
        self.t_ok.append(c.t[c.ok])
        if c.resent is not None:
            self.resent += int(np.nansum(c.resent))
        self.errors.update(str(e) for e in c.err[~c.ok])
        self.workers |= c.workers()
        self.stream.add(c.ok, c.lat, c.tokens, c.llm)

    def finish(self, window_s: float, last_done: float) -> dict:
        """The step's statistics over ``window_s`` seconds; frees the latencies."""
        for c in self.pending:
            self.add(c.take(c.t < last_done))
        self.pending = []
        if not (np.isfinite(window_s) and window_s > 0) or self.n == 0:
            self.result = empty_stats() | {"foreign_rows": self.foreign, "resent": self.resent}
            self.stream.finish(math.nan)  # frees what it kept
        else:
            lat = np.concatenate(self.lat)
            self.result = window_stats(lat, self.n, self.errors, window_s) | {
                "foreign_rows": self.foreign, "resent": self.resent, "tokens_out": self.tokens_out,
                "in_flight": self.busy_s / window_s} | self.stream.finish(window_s)
            self.result["tokens_s"] = self.tokens_out / window_s  # NaN when no tokens were recorded
            # what the step's figures are resampled from (kneeswarm.analysis.measure.resample)
            self.result[BLOCKS_KEY] = BlockSample.of(np.concatenate(self.t_ok), lat, self.t_lo, self.t_lo + window_s,
                                                     seed=int(self.index) if math.isfinite(self.index) else 0)
        self.lat, self.t_ok = [], []
        return self.result


def empty_stats() -> dict:
    return dict(requests=0, ok=0, qps=np.nan, **{BLOCKS_KEY: None}, rps=np.nan, mean_ms=np.nan,
                **{k: np.nan for k in PERCENTILES}, error_rate=np.nan, errors={}, foreign_rows=0, resent=0, tokens_out=np.nan, in_flight=np.nan,
                **{k: np.nan for k in STREAM_STEP_KEYS})


def window_stats(lat_ok: np.ndarray, n: int, errors: Counter, w: float) -> dict:
    """A step's statistics from its successful latencies, its row count and its error counts."""
    n_ok = len(lat_ok)
    stats: dict[str, Any] = dict(requests=n, ok=n_ok, qps=n_ok / w, rps=n / w)
    if n_ok:
        pct = np.percentile(lat_ok, list(PERCENTILES.values()))
        stats |= dict(mean_ms=float(lat_ok.mean()), **{k: float(v) for k, v in zip(PERCENTILES, pct)})
    else:
        stats |= dict(mean_ms=np.nan, **{k: np.nan for k in PERCENTILES})
    stats["errors"] = {k: int(errors[k]) for k in sorted(errors)}
    stats["error_rate"] = (n - n_ok) / n if n else np.nan
    return stats


# -- the timeline -----------------------------------------------------------------------------
def group_quantile(groups: np.ndarray, values: np.ndarray, q: float) -> tuple[np.ndarray, np.ndarray]:
    """(group, quantile q of its values) for each group; numpy's default (linear) quantile.

    Sorted by group only (an integer sort), then one ``np.quantile`` (a partition, not a sort)
    per group: a timeline has a handful of groups per part.
    """
    order = np.argsort(groups, kind="stable")
    g, v = groups[order], values[order]
    uniq, start = np.unique(g, return_index=True)
    return uniq, np.array([np.quantile(seg, q) for seg in np.split(v, start[1:])], dtype=float)


def _count(counter: Counter, bins: np.ndarray) -> None:
    """Add the number of times each bin occurs to ``counter``."""
    if not len(bins):
        return
    lo = int(bins.min())
    n = np.bincount(bins - lo)
    hit = np.flatnonzero(n)
    counter.update(dict(zip((hit + lo).tolist(), n[hit].tolist())))


class Timeline:
    """Per bin of completion time since ``t0``: successes, failures and the P99 of the successes."""

    def __init__(self, t0: float, bin_s: float = BIN_S):
        self.t0, self.bin_s = t0, bin_s
        self.ok: Counter[int] = Counter()
        self.failed: Counter[int] = Counter()
        self.p99: dict[int, float] = {}
        self._bins: list[np.ndarray] = []  # successes' bins and latencies not yet closed
        self._lat: list[np.ndarray] = []

    def add(self, c: Chunk) -> None:
        if not len(c.t):
            return
        b = np.floor((c.done() - self.t0) / self.bin_s)
        keep = np.isfinite(b)
        b, ok = b[keep].astype(np.int64), c.ok[keep]
        _count(self.ok, b[ok])
        _count(self.failed, b[~ok])
        self._bins.append(b[ok])
        self._lat.append(c.lat[keep][ok])

    def close(self, frontier: float) -> None:
        """P99 of every bin that ends at or before ``frontier`` (no later row can complete in it)."""
        if not self._bins:
            return
        b, lat = np.concatenate(self._bins), np.concatenate(self._lat)
        last = math.floor((frontier - self.t0) / self.bin_s) if math.isfinite(frontier) else None
        closed = np.ones(len(b), dtype=bool) if last is None else b < last
        if closed.any():
            uniq, p = group_quantile(b[closed], lat[closed], TIMELINE_QUANTILE)
            self.p99.update(zip(uniq.tolist(), p.tolist()))
        self._bins, self._lat = ([b[~closed]], [lat[~closed]]) if (~closed).any() else ([], [])

    def frame(self) -> pd.DataFrame:
        """t (s since t0), qps (ok/s), errors_s, p99_ms: every bin from the first to the last."""
        self.close(math.inf)
        bins = set(self.ok) | set(self.failed)
        if not bins:
            return pd.DataFrame(columns=["t", "qps", "errors_s", "p99_ms"])
        full = np.arange(min(bins), max(bins) + 1)
        get = lambda d, default: np.array([d.get(int(i), default) for i in full], dtype=float)  # noqa: E731
        return pd.DataFrame({"t": full * self.bin_s, "qps": get(self.ok, 0) / self.bin_s,
                             "errors_s": get(self.failed, 0) / self.bin_s, "p99_ms": get(self.p99, np.nan)})


def timeline_bin(span_s: float) -> float:
    """BIN_S, widened to whole seconds so that ``span_s`` needs at most TIMELINE_MAX_BINS bins."""
    if not (math.isfinite(span_s) and span_s > 0):
        return BIN_S
    return max(BIN_S, float(math.ceil(span_s / BIN_S / TIMELINE_MAX_BINS)) * BIN_S)


# -- the run ----------------------------------------------------------------------------------
@dataclass
class ScanResult:
    """What analysis needs from the request rows (see :func:`scan_parts`)."""

    stats: pd.DataFrame  # the windows (windows.resolve_windows) + requests, ok, qps, ..., foreign_rows
    workers: list[set[str]]  # per step: the generator-CSV names of the workers that sent its rows
    timeline: pd.DataFrame  # Timeline.frame()
    t0: float  # the timeline's origin: the first ramp or the first request, whichever is earlier
    bin_s: float
    requests: int = 0
    ok: int = 0
    unreadable: list[UnreadablePart] = field(default_factory=list)


class RequestScan:
    """Feed chunks in order of their first t_start with :meth:`add`, then :meth:`finish`."""

    def __init__(self, steps: pd.DataFrame, settle: float | np.ndarray, t0: float, bin_s: float = BIN_S, sla: Any = None):
        """``sla``: the plan's [sla] table (goodput is judged against it; None: no goodput)."""
        self.steps, self.settle = steps, settle
        win = resolve_windows(steps, math.inf, settle)  # open windows end at +inf until the end
        limits = goodput_limits(sla)
        self.accs = [StepAcc(float(r["index"]), float(r["t_lo"]), float(r["t_hi"]), stream=StreamAcc(dict(limits)))
                     for r in win.to_dict("records")]
        self.timeline = Timeline(t0, bin_s)
        self.t0, self.bin_s = t0, bin_s
        self.requests = self.ok = 0
        self.last_done = -math.inf

    def add(self, c: Chunk) -> None:
        self.requests += len(c.t)
        self.ok += int(c.ok.sum())
        done = c.done()
        if len(c.t) and np.isfinite(done).any():
            self.last_done = max(self.last_done, float(np.nanmax(done)))
        for acc in self.accs:
            if acc.usable and acc.result is None:
                acc.route(c)
                acc.overlap(c, done)
        self.timeline.add(c)

    def close(self, frontier: float) -> None:
        """Reduce every window and timeline bin that no row at or after ``frontier`` can reach."""
        for acc in self.accs:
            if acc.result is None and acc.usable and math.isfinite(acc.t_hi) and acc.t_hi <= frontier:
                acc.finish(acc.t_hi - acc.t_lo, self.last_done)
        self.timeline.close(frontier)

    def finish(self, unreadable: list[UnreadablePart] | None = None) -> ScanResult:
        last = self.last_done if math.isfinite(self.last_done) else np.nan
        win = resolve_windows(self.steps, last, self.settle)
        rows = []
        for acc, w in zip(self.accs, win["window_s"].to_numpy(dtype=float)):
            rows.append(acc.result if acc.result is not None else acc.finish(w, last))
        stats = pd.concat([win, pd.DataFrame(rows, index=win.index, columns=list(empty_stats()))], axis=1)
        return ScanResult(stats=stats, workers=[acc.workers for acc in self.accs], timeline=self.timeline.frame(),
                          t0=self.t0, bin_s=self.bin_s, requests=self.requests, ok=self.ok,
                          unreadable=list(unreadable or []))


def scan_frame(requests: pd.DataFrame, steps: pd.DataFrame, settle: float | np.ndarray, t0: float | None = None,
               sla: Any = None) -> ScanResult:
    """The scan of rows already in memory (one chunk)."""
    c = Chunk.of(requests)
    start = run_start(steps, [float(np.nanmin(c.t))] if len(c.t) and np.isfinite(c.t).any() else [])
    scan = RequestScan(steps, settle, start if t0 is None else t0, BIN_S, sla)
    scan.add(c)
    return scan.finish()


def run_start(steps: pd.DataFrame, first_starts: Iterable[float]) -> float:
    """The time origin: the first step's ramp or the first request, whichever is earlier; else 0."""
    ramps = pd.to_numeric(steps["t_ramp"], errors="coerce") if "t_ramp" in steps.columns else pd.Series([], dtype=float)
    candidates = [float(x) for x in [*ramps.dropna().tolist(), *first_starts] if np.isfinite(x)]
    return min(candidates) if candidates else 0.0


@dataclass
class Part:
    path: Path
    t_min: float
    t_max: float
    streamed: bool = False  # some row has a ttft_ms or chunks_out (footer statistics; true when they are missing)


def footer_streamed(meta: pq.FileMetaData) -> bool:
    """Whether a part may hold streamed rows: its ``ttft_ms`` or ``chunks_out`` column (a stream
    without text has no TTFT) is not null on every row."""
    for name in ("ttft_ms", "chunks_out"):
        if name not in meta.schema.names:
            continue
        j = meta.schema.names.index(name)
        for i in range(meta.num_row_groups):
            rg = meta.row_group(i)
            st = rg.column(j).statistics
            if st is None or st.null_count is None or st.null_count < rg.num_rows:
                return True
    return False


def part_order(paths: list[Path]) -> tuple[list[Part], list[UnreadablePart]]:
    """The readable parts sorted by their first t_start (from the footer; from the column when the
    footer has no statistics), and the parts whose footer cannot be read."""
    parts, bad = [], []
    for path in paths:
        try:
            meta = pq.ParquetFile(path).metadata
            rng = footer_range(meta, "t_start")
            if rng is None:  # no statistics: read the one column
                t = pq.read_table(path, columns=["t_start"]).column(0).to_numpy(zero_copy_only=False)
                t = t[np.isfinite(t)]
                rng = (float(t.min()), float(t.max())) if len(t) else (math.inf, -math.inf)
        except Exception as e:  # noqa: BLE001 - a torn part is counted, never fatal
            bad.append(unreadable_part(path, e))
            continue
        parts.append(Part(path, float(rng[0]), float(rng[1]), footer_streamed(meta)))
    parts.sort(key=lambda p: p.t_min)
    return parts, bad


def scan_parts(rd: RunDir, steps: pd.DataFrame, settle: float | np.ndarray, sla: Any = None) -> ScanResult:
    """One pass over requests/part-*.parquet (see the module docstring); ``sla``: the plan's [sla]
    table, for goodput."""
    parts, unreadable = part_order(rd.request_parts())
    starts = [p.t_min for p in parts if math.isfinite(p.t_min)]
    t0 = run_start(steps, starts[:1])
    ends = [p.t_max for p in parts if math.isfinite(p.t_max)]
    ends += pd.to_numeric(steps.get("t_end", pd.Series([], dtype=float)), errors="coerce").dropna().tolist()
    scan = RequestScan(steps, settle, t0, timeline_bin(max(ends, default=t0) - t0), sla)
    columns = [c for c in READ_COLUMNS if c in REQUEST_SCHEMA.names]
    for i, part in enumerate(parts):
        try:
            table = pq.read_table(part.path, columns=columns + (list(STREAM_COLUMNS) if part.streamed else []),
                                  schema=REQUEST_SCHEMA)
            llm = StreamRows.of_table(table) if part.streamed else None
        except Exception as e:  # noqa: BLE001 - a part torn inside: counted with what its footer says
            bad = unreadable_part(part.path, e)
            logger.warning("%s", bad.line())
            unreadable.append(bad)
            continue
        scan.add(Chunk.of_table(table, llm))
        scan.close(parts[i + 1].t_min if i + 1 < len(parts) else math.inf)
    unreadable.sort(key=lambda u: u.path.name)
    return scan.finish(unreadable)

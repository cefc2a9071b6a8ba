"""Live figures of a run as its directory grows: what the export (kneeswarm/launch/export.py) serves.

Everything is read from the run directory, the contract every part shares, so the master (which
writes it) and the conductor (after the master has gone) serve the same figures:

* steps.csv: the current step, its users (open loop: its rate, users x ``source_rate``);
* requests/part-*.parquet, each part read once as it appears: per step, the successful rows'
  QPS and P99 over the step's steady window, defined exactly as the summary defines them
  (kneeswarm.analysis.measure.windows, kneeswarm.analysis.measure.loadstats: rows stamped with the step whose ``t_start`` lies in
  ``[t_lo, t_hi)``, success = ``ok`` and a finite latency >= 0, ``numpy.percentile``'s linear
  P99, QPS = successes / window seconds), so a step's final figure equals summary.json's;
* hosts/<host>/*.csv: the latest sample of each monitored host's tables (the tail of the file);
* report/summary.json once written: the findings, the knee and the peak.

A step is *final* once its ``t_end`` is recorded and either ``LAG_S`` has passed since (a
worker's rows reach the master within one report interval plus one flush) or the summary exists
(the recording is over).  A final step's figures are kept and its latencies freed; rows of a
final step that arrive later are counted in ``late_rows`` (a final figure that missed them says
so), never silently added.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from kneeswarm.analysis.measure.windows import resolve_windows, step_settles
from kneeswarm.analysis.schema.summary import Finding, Knee
from kneeswarm.contracts.plan import LoadPlan, arrivals_of, is_soak
from kneeswarm.contracts.rundir import RunDir, split_table_name

logger = logging.getLogger(__name__)

#: seconds after a step's t_end by which all its rows have reached the run directory: Locust's
#: worker report interval (3 s) + the master's flush (2 s) + 1 s of margin (plugin.AUTO_HOLD_MARGIN_S)
LAG_S = 6.0
P99 = 99.0
#: the host tables exported (their latest sample); threads is left out: one row per thread
HOST_TABLES = ("vmstat", "process", "gpu", "gpu_procs", "cgroup", "prometheus")
ID_COLUMNS = {"t", "pid", "gpu", "tid", "version", "name"}  # labels or keys, not samples
MAX_HOST_SERIES = 200  # per host and table (a server's /metrics may hold thousands of buckets)
TAIL_BYTES = 65536  # the end of a host CSV read for its latest sample
PART_COLUMNS = ["t_start", "latency_ms", "ok", "step"]


@dataclass
class StepFigures:
    index: int
    users: int
    rate: float | None  # open loop: arrivals/s (users x source_rate)
    t_ramp: float
    t_end: float | None
    requests: int = 0  # rows in the steady window so far
    ok: int = 0
    qps: float | None = None
    p99_ms: float | None = None
    window_s: float | None = None
    final: bool = False


@dataclass
class HostSample:
    host: str
    table: str
    column: str
    id: str  # pid or gpu where the table has several rows per sample, else ""
    value: float
    t: float


@dataclass
class Figures:
    run_id: str
    current: StepFigures | None
    steps: list[StepFigures]
    hosts: list[HostSample]
    findings: list[Finding] = field(default_factory=list)  # {id, severity, steps}
    knee: dict[str, Knee] = field(default_factory=dict)  # summary's knee, latency_knee, peak
    done: bool = False  # summary.json is written
    late_rows: int = 0
    unreadable_parts: int = 0


class _StepRows:
    """One step's rows so far: every row's t_start, and the successful rows' t_start and latency."""

    def __init__(self) -> None:
        self.t_all: list[np.ndarray] = []
        self.t_ok: list[np.ndarray] = []
        self.lat_ok: list[np.ndarray] = []
        self.result: StepFigures | None = None  # set once final (and the arrays freed)

    def add(self, t: np.ndarray, ok: np.ndarray, lat: np.ndarray) -> None:
        self.t_all.append(t)
        self.t_ok.append(t[ok])
        self.lat_ok.append(lat[ok])

    def figures(self, fig: StepFigures, t_lo: float, t_hi: float) -> StepFigures:
        t_all = np.concatenate(self.t_all) if self.t_all else np.empty(0)
        t_ok = np.concatenate(self.t_ok) if self.t_ok else np.empty(0)
        lat = np.concatenate(self.lat_ok) if self.lat_ok else np.empty(0)
        self.t_all, self.t_ok, self.lat_ok = [t_all], [t_ok], [lat]
        w = t_hi - t_lo
        fig.window_s = w if math.isfinite(w) else None
        if not (math.isfinite(w) and w > 0):
            return fig
        fig.requests = int(((t_all >= t_lo) & (t_all < t_hi)).sum())
        lat_in = lat[(t_ok >= t_lo) & (t_ok < t_hi)]
        fig.ok = len(lat_in)
        if fig.requests:
            fig.qps = fig.ok / w
        if fig.ok:
            fig.p99_ms = float(np.percentile(lat_in, P99))
        return fig


class LiveRun:
    """The live reader of one run directory; ``figures()`` reads what is new and returns a snapshot."""

    def __init__(self, run: RunDir, lag_s: float = LAG_S) -> None:
        self.run, self.lag_s = run, lag_s
        self._parts: set[str] = set()
        self._steps: dict[int, _StepRows] = {}
        self._load: LoadPlan | None = None
        self._arrivals = "closed"
        self._soak: dict[str, str] = {}
        self.late_rows = 0
        self.unreadable_parts = 0
        self._tails: dict[Path, tuple[tuple[int, int], list[HostSample]]] = {}

    # -- the plan's load keys ---------------------------------------------------------------
    def _plan(self) -> LoadPlan:
        if self._load is None:
            try:
                load = tomllib.loads(self.run.plan_path.read_text()).get("load", {})
            except (OSError, tomllib.TOMLDecodeError):
                return LoadPlan()  # not written yet: read again next time
            self._arrivals = arrivals_of(load)
            self._soak = {"mode": "soak"} if is_soak(load) else {}  # a soak's later windows leave no settle out
            base = LoadPlan()
            self._load = LoadPlan(settle=float(load.get("settle", base.settle)),
                                  source_rate=float(load.get("source_rate", base.source_rate)))
        return self._load

    # -- request rows -----------------------------------------------------------------------
    def _read_parts(self) -> None:
        for path in self.run.request_parts():
            if path.name in self._parts:
                continue
            self._parts.add(path.name)  # a part is written once, whole (rundir.write_request_part)
            try:
                table = pq.read_table(path, columns=PART_COLUMNS)
            except Exception as e:  # noqa: BLE001 - counted, and the summary names it too
                self.unreadable_parts += 1
                logger.warning("kneeswarm export: %s unreadable: %s", path.name, e)
                continue
            self._add_rows(table.to_pandas())

    def _add_rows(self, df: pd.DataFrame) -> None:
        t = df["t_start"].to_numpy(dtype=float)
        lat = pd.to_numeric(df["latency_ms"], errors="coerce").to_numpy(dtype=float)
        with np.errstate(invalid="ignore"):
            ok = np.asarray(df["ok"].to_numpy() == True, dtype=bool) & np.isfinite(lat) & (lat >= 0)  # noqa: E712
        step = pd.to_numeric(df["step"], errors="coerce").to_numpy(dtype=float)
        for s in np.unique(step[np.isfinite(step) & (step >= 0)]).astype(int):
            rows = step == s
            entry = self._steps.setdefault(int(s), _StepRows())
            if entry.result is not None:
                self.late_rows += int(rows.sum())
                continue
            entry.add(t[rows], ok[rows], lat[rows])

    # -- the snapshot -----------------------------------------------------------------------
    def figures(self, now: float | None = None) -> Figures:
        now = time.time() if now is None else now
        load = self._plan()
        self._read_parts()
        summary = _read_json(self.run.summary_path)
        done = isinstance(summary, dict)
        steps = self._step_figures(load, now, done)
        current = steps[-1] if steps else None
        fig = Figures(run_id=self.run.path.name, current=current, steps=steps, hosts=self.host_samples(),
                      done=done, late_rows=self.late_rows, unreadable_parts=self.unreadable_parts)
        if done:
            fig.findings = [cast(Finding, {"id": f.get("id"), "severity": f.get("severity"), "steps": f.get("steps")})
                            for f in summary.get("findings") or [] if isinstance(f, dict)]  # summary.json as read
            fig.knee = {k: summary.get(k) for k in ("knee", "latency_knee", "peak") if isinstance(summary.get(k), dict)}
        return fig

    def _step_figures(self, load: LoadPlan, now: float, done: bool) -> list[StepFigures]:
        steps = self.run.read_steps()
        if steps.empty:
            return []
        win = resolve_windows(steps, math.nan, step_settles(self._soak, len(steps), load.settle))
        out = []
        for _, row in win.iterrows():
            i, users = int(row["index"]), int(row["users"])
            rate = users * load.source_rate if self._arrivals == "open" else None
            t_end = float(row["t_end"]) if math.isfinite(float(row["t_end"])) else None
            entry = self._steps.setdefault(i, _StepRows())
            if entry.result is not None:
                out.append(entry.result)
                continue
            fig = StepFigures(i, users, rate, float(row["t_ramp"]), t_end)
            final = t_end is not None and (done or now >= t_end + self.lag_s)
            t_hi = t_end if final and t_end is not None else min(math.inf if t_end is None else t_end, now - self.lag_s)
            entry.figures(fig, float(row["t_lo"]), t_hi)
            if final:
                fig.final = True
                entry.result = fig
                entry.t_all = entry.t_ok = entry.lat_ok = []  # the latencies of a final step are freed
            out.append(fig)
        return out

    # -- hosts ------------------------------------------------------------------------------
    def host_samples(self) -> list[HostSample]:
        out: list[HostSample] = []
        for host in self.run.hosts():
            for path in sorted(self.run.host_dir(host).glob("*.csv")):
                table, collector = split_table_name(path.stem)
                if table in HOST_TABLES and collector is None:
                    out += self._tail(host, table, path)
        return out

    def _tail(self, host: str, table: str, path: Path) -> list[HostSample]:
        """The latest sample's rows of a host CSV (read from its end; cached while it is unchanged)."""
        try:
            st = path.stat()
        except OSError:
            return []
        key = (st.st_mtime_ns, st.st_size)
        cached = self._tails.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        samples = latest_samples(host, table, path)
        self._tails[path] = (key, samples)
        return samples


def latest_samples(host: str, table: str, path: Path) -> list[HostSample]:
    """The rows of a parsed host CSV at its latest ``t``, as one HostSample per numeric cell."""
    try:
        with path.open("rb") as f:
            header = f.readline().decode()
            size = f.seek(0, io.SEEK_END)
            f.seek(max(len(header), size - TAIL_BYTES))
            tail = f.read().decode(errors="replace").splitlines()
    except OSError:
        return []
    if size > TAIL_BYTES + len(header) and tail:
        tail = tail[1:]  # the first line may be cut
    columns = next(csv.reader([header]))
    rows = [r for r in csv.reader(tail) if len(r) == len(columns)]
    if not rows or "t" not in columns:
        return []
    ti = columns.index("t")
    times = [_float(r[ti]) for r in rows]
    last = max((t for t in times if math.isfinite(t)), default=math.nan)
    key = next((c for c in ("pid", "gpu") if c in columns), None)
    out: list[HostSample] = []
    for r, t in zip(rows, times):
        if t != last:
            continue
        ident = r[columns.index(key)] if key else ""
        for c, v in zip(columns, r):
            value = _float(v)
            if c in ID_COLUMNS or "_bucket" in c or not math.isfinite(value):
                continue
            if len(out) >= MAX_HOST_SERIES:
                return out
            out.append(HostSample(host, table, c, ident, value, t))
    return out


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None

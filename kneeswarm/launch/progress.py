"""Where a headless run is: step i of N, users, QPS and P99 so far, errors, time left (floor 4).

Read from what the master writes into the run directory (steps.csv and the request parts, each
part read once), in the conductor's poll loop.  On a terminal one live line is redrawn; in a
pipeline log (stderr not a TTY) there is one plain line per step, printed once the step's rows
are in, with no control codes:

    kneeswarm: step 2/5: 2 users, 812 requests, 40.1 QPS, P99 51.3 ms, 0 errors, ~48s left
    kneeswarm: step 5/5: 16 users, 1630 requests, 79.8 QPS, P99 212.0 ms, 3 errors (0.2%), done

The figures are a progress display ("so far"), not the report: the report computes its own from
all rows, with the settle time left out.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np
import pyarrow.parquet as pq

from kneeswarm.contracts.plan import Plan
from kneeswarm.contracts.rundir import RunDir

logger = logging.getLogger(__name__)

PROGRESS_PERIOD = 1.0  # seconds between reads of the run directory
MIN_SPAN = 0.5  # seconds of rows a QPS figure needs
PART_COLUMNS = ["t_start", "latency_ms", "ok", "step"]


@dataclass
class StepSoFar:
    """The rows of one step seen so far; once the step is over (``close``), only its figures: a
    soak's hours of windows keep one window of rows, not the run's (memory bounded over hours)."""

    t: list[np.ndarray] = field(default_factory=list)
    latency: list[np.ndarray] = field(default_factory=list)
    ok: list[np.ndarray] = field(default_factory=list)
    klass: list[np.ndarray] = field(default_factory=list)  # a traffic mix: each row's class (None: no class)
    closed: dict[float, tuple] | None = None  # t_from -> (requests, errors, QPS, P99, P50) of a step over
    closed_classes: dict[float, dict] | None = None  # t_from -> by_class of a step over

    def add(self, t: np.ndarray, latency: np.ndarray, ok: np.ndarray, klass: np.ndarray | None = None) -> None:
        if self.closed is None:  # rows arriving after the step's line was printed: not shown
            self.t.append(t)
            self.latency.append(latency)
            self.ok.append(ok)
            if klass is not None:
                self.klass.append(klass)

    def _all(self, t_from: float) -> tuple[int, int, float | None, float | None, float | None]:
        if self.closed is not None:
            return self.closed.get(t_from) or next(iter(self.closed.values()))
        if not self.t:
            return 0, 0, None, None, None
        t, lat, ok = np.concatenate(self.t), np.concatenate(self.latency), np.concatenate(self.ok)
        steady = t >= t_from
        span = float(t[steady].max() - t_from) if steady.any() else 0.0
        qps = float(steady.sum() / span) if span >= MIN_SPAN else None
        lat_ok = lat[steady & ok]
        p99, p50 = (float(v) for v in np.percentile(lat_ok, [99, 50])) if len(lat_ok) else (None, None)
        return len(t), int((~ok).sum()), qps, p99, p50

    def figures(self, t_from: float) -> tuple[int, int, float | None, float | None]:
        """(requests, errors, QPS, P99 ms) of the rows seen; QPS and P99 over those from ``t_from``."""
        return self._all(t_from)[:4]

    def p50(self, t_from: float) -> float | None:
        return self._all(t_from)[4]

    def by_class(self, t_from: float) -> dict[str, tuple[int, int, float | None, float | None]]:
        """A traffic mix: {class: (requests, errors, QPS, P99 ms)} of the rows seen while the step
        is not over, kept once it is; QPS over the step's steady span (the whole's,
        so the classes' QPS add up to the step's), P99 of the class's steady answered rows."""
        if self.closed is not None:
            return (self.closed_classes or {}).get(t_from, {})
        if not self.t or len(self.klass) != len(self.t):
            return {}
        t, lat, ok = np.concatenate(self.t), np.concatenate(self.latency), np.concatenate(self.ok)
        klass = np.concatenate(self.klass)
        steady = t >= t_from
        span = float(t[steady].max() - t_from) if steady.any() else 0.0
        out: dict[str, tuple[int, int, float | None, float | None]] = {}
        for name in sorted({str(k) for k in klass if k is not None}):
            mine = klass == name
            lat_ok = lat[mine & steady & ok]
            out[name] = (int(mine.sum()), int((mine & ~ok).sum()),
                         float((mine & steady).sum() / span) if span >= MIN_SPAN else None,
                         float(np.percentile(lat_ok, 99)) if len(lat_ok) else None)
        return out

    def close(self, t_froms: list[float]) -> None:
        """The step is over: keep its figures from each of ``t_froms``, free its rows."""
        if self.closed is None:
            self.closed_classes = {t: self.by_class(t) for t in t_froms} if self.klass else None
            self.closed = {t: self._all(t) for t in t_froms}
            self.t, self.latency, self.ok, self.klass = [], [], [], []


def steady_from(st: Any, load: Any, settle: bool = True) -> float:
    """Where a step's steady rows begin for a display: its t_steady (else t_ramp), with ``settle``
    the plan's settle after it (a soak: its first window only) and hold = "auto"'s cut."""
    t = st["t_steady"] if st["t_steady"] == st["t_steady"] else st["t_ramp"]
    if not settle:
        return float(t)
    t += load.settle if load.mode != "soak" or int(st["index"]) == 0 else 0.0
    cut = st.get("t_cut")
    if isinstance(cut, (int, float)) and math.isfinite(cut):  # hold = "auto": the master's warm-up cut
        t = max(t, float(cut))
    return float(t)


class Progress:
    def __init__(self, run: RunDir, plan: Plan, stream: TextIO | None = None, live: bool | None = None):
        self.run, self.plan = run, plan
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self._read: set[str] = set()  # part files already read (a part is never rewritten)
        self._steps: dict[int, StepSoFar] = {}
        self.mixed = bool(plan.request.classes)  # a traffic mix: each row's class is read too
        self.class_rows: dict[str, int] = {}  # a traffic mix: rows of each class read so far, every step
        self._printed = -1  # the last step whose line was printed
        self._last_poll = 0.0
        self._live_shown = False

    def poll(self, now: float | None = None, force: bool = False) -> None:
        """Read what is new; print the lines of finished steps, and the live line on a terminal."""
        mono = time.monotonic()
        if not force and mono - self._last_poll < PROGRESS_PERIOD:
            return
        self._last_poll = mono
        try:
            steps = self.run.read_steps()
            self._read_parts()
        except Exception as e:  # noqa: BLE001 - a display must never end a run (the data is on disk)
            logger.debug("progress: %s", e)
            return
        now = time.time() if now is None else now
        newest_rows = max(self._steps, default=-1)
        for _, st in steps.iterrows():
            i = int(st["index"])
            if self._printed < i < newest_rows:  # rows of a later step are in: this one's are too
                self._line(self._text(st, self._time_left(steps, now)))
                self._printed = i
                self._steps.get(i, StepSoFar()).close([steady_from(st, self.plan.load, s) for s in (False, True)])
        if self.live and len(steps) and int(steps.iloc[-1]["index"]) > self._printed:
            self._show_live(self._text(steps.iloc[-1], self._time_left(steps, now)))

    def finish(self) -> None:
        """The load is over: every step not yet printed gets its line."""
        self.poll(force=True)
        try:
            steps = self.run.read_steps()
        except Exception as e:  # noqa: BLE001 - a display must never end a run
            logger.debug("progress: %s", e)
            return
        for _, st in steps.iterrows():
            if int(st["index"]) > self._printed:
                self._line(self._text(st, None))
                self._printed = int(st["index"])
        if self._live_shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()

    # -- reading -------------------------------------------------------------------------
    def _read_parts(self) -> None:
        for part in self.run.request_parts():
            if part.name in self._read:
                continue
            mixed = self.mixed and "class" in pq.read_schema(part).names
            table = pq.read_table(part, columns=PART_COLUMNS + (["class"] if mixed else []))
            self._read.add(part.name)
            step = table.column("step").to_numpy(zero_copy_only=False)
            t = table.column("t_start").to_numpy(zero_copy_only=False)
            lat = table.column("latency_ms").to_numpy(zero_copy_only=False)
            ok = table.column("ok").to_numpy(zero_copy_only=False).astype(bool)
            klass = np.asarray(table.column("class").to_pylist(), dtype=object) if mixed else None
            if klass is not None:
                for name, n in zip(*np.unique(klass[klass != None], return_counts=True)):  # noqa: E711 - numpy's elementwise test
                    self.class_rows[str(name)] = self.class_rows.get(str(name), 0) + int(n)
            for i in np.unique(step):
                if i >= 0:
                    m = step == i
                    self._steps.setdefault(int(i), StepSoFar()).add(t[m], lat[m], ok[m],
                                                                     klass[m] if klass is not None else None)

    # -- text ----------------------------------------------------------------------------
    def _text(self, st: Any, left: float | None) -> str:
        """A step's line; ``left``: seconds of load left in the run, None once it is over."""
        i, users = int(st["index"]), int(st["users"])
        t_steady = st["t_steady"] if np.isfinite(st["t_steady"]) else st["t_ramp"]
        n, errors, qps, p99 = self._steps.get(i, StepSoFar()).figures(float(t_steady))
        unit = "window" if self.plan.load.mode == "soak" else "probe" if self.plan.load.mode == "search" else "step"
        of = "" if self.plan.load.mode == "search" else f"/{len(self.plan.load.steps)}"  # a search: probes as chosen
        parts = [f"{unit} {i + 1}{of}: {users} user{'s' if users != 1 else ''}",
                 f"{n} requests",
                 f"{qps:.1f} QPS" if qps is not None else "– QPS",
                 f"P99 {p99:.1f} ms" if p99 is not None else "P99 –",
                 f"{errors} errors" + (f" ({100.0 * errors / n:.1f}%)" if errors and n else "")]
        parts.append("done" if left is None else f"~{_duration(left)} left")
        return ", ".join(parts)

    def _time_left(self, steps: Any, now: float) -> float:
        """Seconds of load the plan has left, from the step running now (the last in steps.csv)."""
        load = self.plan.load
        st = steps.iloc[-1]
        hold = load.hold_s()  # hold = "auto": at most max_hold (a step may end sooner)
        if load.mode == "search":  # at most max_duration of load, whatever the probes
            return max(0.0, load.max_duration - float(now - steps["t_ramp"].min()))
        ramp = 0.0 if load.mode == "soak" else load.ramp  # a soak's later windows do not ramp
        later = (len(load.steps) - 1 - int(st["index"])) * (ramp + hold)
        if np.isfinite(st["t_steady"]):
            return later + max(0.0, float(st["t_steady"]) + hold - now)
        return later + hold + max(0.0, float(st["t_ramp"]) + load.ramp - now)

    def _line(self, text: str) -> None:
        prefix = "\r\x1b[K" if self._live_shown else ""
        self._live_shown = False
        self.stream.write(f"{prefix}kneeswarm: {text}\n")
        self.stream.flush()

    def _show_live(self, text: str) -> None:
        self.stream.write(f"\r\x1b[Kkneeswarm: {text}")
        self.stream.flush()
        self._live_shown = True


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"

"""Worker clock offsets, measured over Locust's own master<->worker channel (NTP/Cristian).

Request rows carry the worker's ``time.time()``. On one machine that is the master's clock;
on another load machine it is not, and a few hundred milliseconds of skew would put requests
in the wrong step. So the master pings each worker: it sends t1, the worker answers with its
own time t2, the answer arrives at t4. For that round trip

    offset = t2 - (t1 + t4) / 2        (worker clock minus master clock; error <= RTT / 2)

and the sample with the lowest RTT is kept.  ``ClockGate`` is the one place where the offset
is taken off a worker's rows and generator samples, so the run directory is on the master's
clock.  A worker's first rows can arrive before its first answer: the gate holds them until
the answer comes (at most FIRST_ANSWER_WAIT seconds), and counts any it had to let through on
the worker's own clock.  A worker's row watermark (watermark.py) rides with its rows: corrected by
the same offset and let through only with them, so it never runs ahead of the rows it vouches for.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, TypedDict

logger = logging.getLogger(__name__)

PING = "kneeswarm_ping"
PONG = "kneeswarm_pong"
PINGS_PER_ROUND = 8  # round trips per measurement round
PING_SPACING = 0.05  # seconds between the pings of a round
ROUND_PERIOD = 15.0  # seconds between rounds during a test (drift, late workers)
FIRST_ANSWER_WAIT = 10.0  # seconds a worker's rows wait for its first clock answer, then go uncorrected


@dataclass
class Sample:
    rtt: float
    offset: float
    t: float  # master time of the answer


class Ping(TypedDict):
    """PING, master -> worker: the master's send time."""
    t1: float


class Pong(TypedDict):
    """PONG, worker -> master: the ping's t1 echoed (None if it had none) and the worker's time."""
    t1: float | None
    t2: float


class WorkerClocks:
    """The master's view of every worker's clock."""

    def __init__(self) -> None:
        self._best: dict[str, Sample] = {}
        self._last: dict[str, Sample] = {}  # best sample of the latest round, for drift
        self._count: dict[str, int] = {}

    def request(self) -> Ping:
        return {"t1": time.time()}

    def answered(self, worker: str, data: Pong | dict[str, Any]) -> None:
        t4 = time.time()
        try:
            got_t1, t2 = data["t1"], float(data["t2"])
            if got_t1 is None:
                return  # the pong of a ping without t1: no round trip to measure
            t1 = float(got_t1)
        except (KeyError, TypeError, ValueError):
            return  # not our format: ignore
        s = Sample(rtt=t4 - t1, offset=t2 - (t1 + t4) / 2, t=t4)
        if s.rtt < 0:
            return
        self._count[worker] = self._count.get(worker, 0) + 1
        if worker not in self._best or s.rtt < self._best[worker].rtt:
            self._best[worker] = s
        last = self._last.get(worker)
        if last is None or t4 - last.t > ROUND_PERIOD / 2 or s.rtt < last.rtt:
            self._last[worker] = s

    def has_answered(self, worker: str) -> bool:
        return worker in self._best

    def offset(self, worker: str) -> float:
        """Seconds to subtract from the worker's times (0.0 until it has answered)."""
        s = self._best.get(worker)
        return s.offset if s else 0.0

    def summary(self) -> dict[str, dict[str, float]]:
        return {
            w: {"offset_s": round(s.offset, 6), "error_s": round(s.rtt / 2, 6), "samples": self._count[w],
                "latest_offset_s": round(self._last[w].offset, 6)}
            for w, s in sorted(self._best.items())
        }


Batch = tuple[str, "dict[str, list] | None", list]  # (worker, request columns, generator samples)


class ClockGate:
    """Puts each worker's rows and generator samples on the master's clock, holding them until
    the worker's first clock answer (or FIRST_ANSWER_WAIT seconds, after which they pass
    uncorrected and are counted in ``uncorrected``)."""

    def __init__(self, clocks: WorkerClocks, wait: float | None = None, now: Callable[[], float] = time.monotonic):
        self.clocks = clocks
        self.wait = FIRST_ANSWER_WAIT if wait is None else wait
        self._now = now
        self._held: dict[str, list[tuple[dict[str, list] | None, list, float | None]]] = {}
        self._watermarks: dict[str, float] = {}  # worker -> the watermark of its last batch released
        self._since: dict[str, float] = {}  # when each worker's first batch arrived
        self.uncorrected: dict[str, dict[str, int]] = {}  # worker -> {"request_rows": n, "generator_rows": m}
        self.last_admitted: dict[str, float] = {}  # worker -> master time (epoch s) of its last report with rows

    def admit(self, worker: str, rows: dict[str, list] | None, samples: list | None,
              watermark: float | None = None) -> None:
        """A worker's report (and its row watermark, on its clock; None from a worker that sends
        none): held until :meth:`release` can put it on the master's clock."""
        if not (rows and rows.get("t_start")) and not samples and watermark is None:
            return
        if rows and rows.get("t_start"):
            self.last_admitted[worker] = time.time()
        self._held.setdefault(worker, []).append((rows, list(samples or []), watermark))
        self._since.setdefault(worker, self._now())

    def release(self, final: bool = False) -> list[Batch]:
        """The batches that can be written now, on the master's clock; ``final`` lets everything go."""
        out: list[Batch] = []
        for worker in list(self._held):
            if self.clocks.has_answered(worker):
                off = self.clocks.offset(worker)
                for rows, samples, mark in self._held.pop(worker):
                    self._released(out, worker, *shift(rows, samples, off), None if mark is None else mark - off)
            elif final or self._now() - self._since[worker] >= self.wait:
                batches = self._held.pop(worker)
                counts = self.uncorrected.setdefault(worker, {"request_rows": 0, "generator_rows": 0})
                for rows, samples, mark in batches:
                    counts["request_rows"] += len(rows["t_start"]) if rows else 0
                    counts["generator_rows"] += len(samples)
                    self._released(out, worker, rows, samples, mark)
                logger.warning("kneeswarm: %s has not answered a clock ping; its rows are written uncorrected", worker)
        return out

    def _released(self, out: list[Batch], worker: str, rows: dict[str, list] | None, samples: list,
                  mark: float | None) -> None:
        if (rows and rows.get("t_start")) or samples:
            out.append((worker, rows, samples))
        if mark is not None:
            self._watermarks[worker] = mark

    def take_watermarks(self) -> dict[str, float]:
        """Each worker's watermark released since the last call (master clock): to be taken after
        the rows :meth:`release` returned were handed over, so that none runs ahead of its rows."""
        marks, self._watermarks = self._watermarks, {}
        return marks

    @property
    def held_rows(self) -> int:
        return sum(len(r["t_start"]) for batches in self._held.values() for r, _, _ in batches if r)

    def warnings(self) -> list[str]:
        return [f"{w}: no clock answer within {self.wait:g}s; {c['request_rows']} request rows and "
                f"{c['generator_rows']} generator samples were written on its own clock (uncorrected)"
                for w, c in sorted(self.uncorrected.items())]

    def lost(self) -> dict[str, int]:
        """For meta.json["lost"]: rows that went out on a worker's own clock (only what is not zero)."""
        out = {"uncorrected_request_rows": sum(c["request_rows"] for c in self.uncorrected.values()),
               "uncorrected_generator_rows": sum(c["generator_rows"] for c in self.uncorrected.values())}
        return {k: v for k, v in out.items() if v}


def shift(rows: dict[str, list] | None, samples: list, offset: float) -> tuple[dict[str, list] | None, list]:
    """Rows and generator samples with ``offset`` (worker minus master) taken off their times."""
    if offset == 0.0:
        return rows, samples
    if rows:
        rows = {**rows, "t_start": [t - offset for t in rows["t_start"]]}
    return rows, [(t - offset, *rest) for t, *rest in samples]


def pong(data: Ping | dict[str, Any]) -> Pong:
    """The worker's answer to a ping: the master's t1 and the worker's own time."""
    return {"t1": data.get("t1"), "t2": time.time()}

"""Worker clock offsets, measured over Locust's own master<->worker channel (NTP/Cristian).

Request rows carry the worker's ``time.time()``. On one machine that is the master's clock;
on another load machine it is not, and a few hundred milliseconds of skew would put requests
in the wrong step. So the master pings each worker: it sends t1, the worker answers with its
own time t2, the answer arrives at t4. For that round trip

    offset = t2 - (t1 + t4) / 2        (worker clock minus master clock; error <= RTT / 2)

and the sample with the lowest RTT is kept. The master subtracts the offset from that
worker's rows and generator samples, so the run directory is on the master's clock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

PING = "kneeswarm_ping"
PONG = "kneeswarm_pong"
PINGS_PER_ROUND = 8  # round trips per measurement round
PING_SPACING = 0.05  # seconds between the pings of a round
ROUND_PERIOD = 15.0  # seconds between rounds during a test (drift, late workers)


@dataclass
class Sample:
    rtt: float
    offset: float
    t: float  # master time of the answer


class WorkerClocks:
    """The master's view of every worker's clock."""

    def __init__(self) -> None:
        self._best: dict[str, Sample] = {}
        self._last: dict[str, Sample] = {}  # best sample of the latest round, for drift
        self._count: dict[str, int] = {}

    def request(self) -> dict[str, float]:
        return {"t1": time.time()}

    def answered(self, worker: str, data: dict[str, Any]) -> None:
        t4 = time.time()
        try:
            t1, t2 = float(data["t1"]), float(data["t2"])
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


def pong(data: dict[str, Any]) -> dict[str, float]:
    """The worker's answer to a ping: the master's t1 and the worker's own time."""
    return {"t1": data.get("t1"), "t2": time.time()}

"""Clock offset of a host from the master, NTP/Cristian style, over a long-lived echo process.

Each round trip: the master notes T1, sends a line; ``remote.py echo`` answers with T2 (when the
line arrived) and T3 (when it answered), on the host's clock; the master notes T4.

    offset θ = ((T2 - T1) + (T3 - T4)) / 2        (host clock minus master clock)
    rtt      = (T4 - T1) - (T3 - T2)              true θ lies within ± rtt/2 of the estimate

Of ``CLOCK_ROUNDS`` round trips the ``CLOCK_KEEP`` with the lowest RTT are kept (queueing and
scheduling delays only ever add RTT); the offset is their median θ and the error bound the
largest kept RTT / 2.  Measured before and after the run, the two give the drift, and
``ClockCorrection.to_master`` maps host timestamps onto the master's clock:
t_master = t_host - θ(t).
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from agents.errors import AgentError
from agents.transport import EchoChannel

logger = logging.getLogger(__name__)

CLOCK_ROUNDS = 50  # round trips per measurement
CLOCK_KEEP = 10  # lowest-RTT round trips kept
CLOCK_REPLY_TIMEOUT = 5.0  # seconds to wait for one echo answer
CLOCK_WARMUP = 3  # first round trips discarded (process start, page faults)


@dataclass
class ClockOffset:
    offset: float  # seconds, host clock minus master clock
    error: float  # bound on |true offset - offset|, seconds
    rtt_min: float
    rtt_median: float
    rounds: int
    kept: int
    t: float  # master time of the measurement

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClockOffset:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


def estimate(samples: list[tuple[float, float, float, float]], keep: int = CLOCK_KEEP) -> ClockOffset:
    """ClockOffset from (T1, T2, T3, T4) round trips."""
    if not samples:
        raise AgentError("clock: no round trip completed")
    rows = []
    for t1, t2, t3, t4 in samples:
        rtt = max(0.0, (t4 - t1) - (t3 - t2))
        rows.append((rtt, ((t2 - t1) + (t3 - t4)) / 2.0))
    rows.sort()
    best = rows[: max(1, keep)]
    return ClockOffset(
        offset=statistics.median(th for _, th in best),
        error=max(r for r, _ in best) / 2.0,
        rtt_min=rows[0][0],
        rtt_median=statistics.median(r for r, _ in rows),
        rounds=len(rows),
        kept=len(best),
        t=samples[-1][3],
    )


def measure(echo: EchoChannel, rounds: int = CLOCK_ROUNDS, keep: int = CLOCK_KEEP,
            label: str = "host") -> ClockOffset:
    """Run ``rounds`` round trips over ``echo`` and estimate the offset."""
    samples = []
    for i in range(rounds + CLOCK_WARMUP):
        t1 = time.time()
        echo.send(b"x\n")
        line = echo.recv_line(CLOCK_REPLY_TIMEOUT)
        t4 = time.time()
        try:
            t2, t3 = (float(x) for x in line.split())
        except ValueError:
            raise AgentError(f"{label}: clock echo answered {line[:60]!r}, expected two timestamps") from None
        if i >= CLOCK_WARMUP:
            samples.append((t1, t2, t3, t4))
    result = estimate(samples, keep)
    logger.info("%s: clock offset %+.6f s ± %.6f s (rtt min %.6f s)", label, result.offset, result.error, result.rtt_min)
    return result


@dataclass
class ClockCorrection:
    """Offsets measured before and after a run; maps host times onto the master's clock."""

    before: ClockOffset | None = None
    after: ClockOffset | None = None

    def offset_at(self, t_host: Any) -> Any:
        """θ at host time(s) t_host: linear between the two measurements, constant outside."""
        b, a = self.before, self.after
        if b is None and a is None:
            return np.zeros_like(np.asarray(t_host, dtype=float)) if np.ndim(t_host) else 0.0
        if b is None or a is None or a.t - b.t < 1e-3:
            only = b or a
            assert only is not None
            return np.full_like(np.asarray(t_host, dtype=float), only.offset) if np.ndim(t_host) else only.offset
        tb, ta = b.t + b.offset, a.t + a.offset  # measurement times on the host's clock
        return np.interp(t_host, [tb, ta], [b.offset, a.offset])

    def to_master(self, t_host: Any) -> Any:
        return np.asarray(t_host, dtype=float) - self.offset_at(t_host)

    @property
    def drift_ppm(self) -> float | None:
        if self.before is None or self.after is None or self.after.t - self.before.t < 1.0:
            return None
        return (self.after.offset - self.before.offset) / (self.after.t - self.before.t) * 1e6

    def to_dict(self) -> dict[str, Any]:
        return {
            "before": self.before.to_dict() if self.before else None,
            "after": self.after.to_dict() if self.after else None,
            "drift_ppm": self.drift_ppm,
            "applied": "t_master = t_host - offset (linear between before and after)",
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> ClockCorrection:
        d = d or {}
        return cls(
            before=ClockOffset.from_dict(d["before"]) if d.get("before") else None,
            after=ClockOffset.from_dict(d["after"]) if d.get("after") else None,
        )


__all__ = ["ClockCorrection", "ClockOffset", "estimate", "measure"]

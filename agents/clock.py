"""Clock offset of a host from the master, NTP/Cristian style, over a long-lived echo process.

Each round trip: the master notes T1, sends a line; ``remote.pyz echo`` answers with T2 (when the
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

from kneeswarm.collectors.correction import ClockCorrection, ClockOffset

from kneeswarm.agents.errors import AgentError
from kneeswarm.agents.transport import EchoChannel

logger = logging.getLogger(__name__)

CLOCK_ROUNDS = 50  # round trips per measurement
CLOCK_KEEP = 10  # lowest-RTT round trips kept
CLOCK_REPLY_TIMEOUT = 5.0  # seconds to wait for one echo answer
CLOCK_WARMUP = 3  # first round trips discarded (process start, page faults)


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


__all__ = ["ClockCorrection", "ClockOffset", "estimate", "measure"]

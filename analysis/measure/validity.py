"""Is a step's number trustworthy?  Little's law for a closed loop: N = X · (R + Z).

N users each either wait for a response (R, the mean latency) or think (Z, the wait between a
user's requests), so the users in the system equal the throughput times the cycle time.  When
X·(R + Z) falls short of N, users spent time neither waiting nor thinking: the generator did not
hold the load it claims (busy workers, scheduling delays, users not all running).

X·R is an estimate of the number in flight that only holds over a window long against the
latencies: X counts the requests that started in the window, so when answers come in bursts (a
CPU quota that releases a period's work at once, a batch that ends together) the window holds one
burst more or less depending on where its edges fall, and X·R misses by that burst.  Where the
scan measured it, the step's ``in_flight`` (the time-average number of requests in flight over
the window: every request's time inside it, summed, over the window's length; kneeswarm.analysis.measure.requestscan)
is that number itself, and replaces X·R; the think time is still X·Z.
"""

from __future__ import annotations

import logging
from typing import Any

from kneeswarm.analysis.schema.summary import SummaryStep, num

logger = logging.getLogger(__name__)

LITTLE_TOLERANCE = 0.10  # chosen, no published figure: within 10 % in closed loop


def littles_law_reason(users: Any, throughput: Any, mean_ms: Any, think_ms: Any = 0.0,
                       tolerance: float = LITTLE_TOLERANCE, in_flight: Any = None) -> str | None:
    """None when ``users`` ≈ ``throughput`` (req/s) × (``mean_ms`` + ``think_ms``) within
    ``tolerance``, or when an input is missing (nothing to check); else a one-line reason.
    ``in_flight``: the measured time-average number in flight, used for X·R when given."""
    n, x, r, l_ = num(users), num(throughput), num(mean_ms), num(in_flight)
    l_ = l_ if l_ is not None and l_ >= 0 else None  # a negative in-flight count is no measurement
    z = num(think_ms) or 0.0
    if n is None or x is None or n <= 0 or x < 0:
        return None
    if l_ is not None:
        in_system = l_ + x * z / 1000.0
        cycle = f"{l_:.2f} in flight on average + {x:,.1f}/s x {z:,.1f} ms thinking = {in_system:.2f}"
    elif r is not None and r >= 0:
        in_system = x * (r + z) / 1000.0
        cycle = f"{x:,.1f}/s x ({r:,.1f} + {z:,.1f}) ms = {in_system:.2f}"
    else:
        return None
    ratio = in_system / n
    if abs(ratio - 1.0) <= tolerance:
        return None
    if ratio < 1.0:
        return (f"Little's law: {cycle} users busy of {n:g} ({ratio:.0%}): the generator did not hold the load "
                "(workers busy, users not all running)")
    return f"Little's law: {cycle} users busy of {n:g} ({ratio:.0%}): more in flight than users (counting error?)"


def step_littles_law(step: SummaryStep, think_ms: float = 0.0, tolerance: float = LITTLE_TOLERANCE) -> str | None:
    """``littles_law_reason`` on a summary step: users, ``rps`` (every request keeps its user busy;
    ``qps`` when rps is missing), ``mean_ms`` and ``in_flight`` where measured."""
    x = num(step.get("rps"))
    return littles_law_reason(step.get("users"), x if x is not None else step.get("qps"), step.get("mean_ms"),
                              think_ms, tolerance, step.get("in_flight"))

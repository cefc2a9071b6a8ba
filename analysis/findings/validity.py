"""Is a step's number trustworthy?  Little's law for a closed loop: N = X · (R + Z).

N users each either wait for a response (R, the mean latency) or think (Z, the wait between a
user's requests), so the users in the system equal the throughput times the cycle time.  When
X·(R + Z) falls short of N, users spent time neither waiting nor thinking: the generator did not
hold the load it claims (busy workers, scheduling delays, users not all running).
"""

from __future__ import annotations

import logging
from typing import Any

from analysis.findings.context import num

logger = logging.getLogger(__name__)

LITTLE_TOLERANCE = 0.10  # issue 7: within 10 % in closed loop


def littles_law_reason(users: Any, throughput: Any, mean_ms: Any, think_ms: Any = 0.0,
                       tolerance: float = LITTLE_TOLERANCE) -> str | None:
    """None when ``users`` ≈ ``throughput`` (req/s) × (``mean_ms`` + ``think_ms``) within
    ``tolerance``, or when an input is missing (nothing to check); else a one-line reason."""
    n, x, r = num(users), num(throughput), num(mean_ms)
    z = num(think_ms) or 0.0
    if n is None or x is None or r is None or n <= 0 or x < 0 or r < 0:
        return None
    in_system = x * (r + z) / 1000.0
    ratio = in_system / n
    if abs(ratio - 1.0) <= tolerance:
        return None
    cycle = f"{x:,.1f}/s x ({r:,.1f} + {z:,.1f}) ms = {in_system:.2f}"
    if ratio < 1.0:
        return (f"Little's law: {cycle} users busy of {n:g} ({ratio:.0%}): the generator did not hold the load "
                "(workers busy, users not all running)")
    return f"Little's law: {cycle} users busy of {n:g} ({ratio:.0%}): more in flight than users (counting error?)"


def step_littles_law(step: dict[str, Any], think_ms: float = 0.0, tolerance: float = LITTLE_TOLERANCE) -> str | None:
    """``littles_law_reason`` on a summary step: users, ``rps`` (every request keeps its user busy;
    ``qps`` when rps is missing) and ``mean_ms``."""
    x = num(step.get("rps"))
    return littles_law_reason(step.get("users"), x if x is not None else step.get("qps"), step.get("mean_ms"),
                              think_ms, tolerance)

"""``--jitter J``: the knee and usl modes' service time made noisy on purpose, seeded.

A real server shared with other work is noisy in two ways, and a run of stepped load sees both:

* each request's time varies (caches, the scheduler): it widens a step's latency percentiles, and
  over a step's hundreds of requests it averages out of its QPS;
* the machine is slower for a while and then faster again (a neighbour's batch job, a noisy
  hypervisor): a whole step's QPS moves, and the same plan run twice gets other figures, another
  knee now and then, findings that fire in one run and not the next.  This is the part that
  ``kneeswarm run --repeat`` exists to show.

So a request's service time is multiplied by two lognormal factors of the same spread J, each with
mean 1 (exp(J·z − J²/2), z standard normal), so that the target's mean service time, its knee and its
curve on average stay the ones its flags set: one factor drawn per request, and one drawn once
every ``--jitter-period`` seconds (counted from the first inference request) and shared by every
request that starts in that period.  Both come from ``--jitter-seed``: the same seed and the same
arrivals give the same times.
"""

from __future__ import annotations

import logging
import math

import numpy as np

logger = logging.getLogger(__name__)

DEFAULT_PERIOD_S = 2.0  # a slow part held 2 s: a step held a few seconds sees one or two of them


def lognormal_factor(spread: float, z: float) -> float:
    """exp(spread·z − spread²/2): a factor of mean 1 over standard normal ``z``."""
    return math.exp(spread * z - spread * spread / 2.0)


class Jitter:
    """The service-time factor of each request (1.0 when ``spread`` is 0)."""

    def __init__(self, spread: float = 0.0, period_s: float = DEFAULT_PERIOD_S, seed: int = 0) -> None:
        self.spread, self.period_s, self.seed = spread, period_s, seed
        self._per_request = np.random.default_rng([seed, 0])
        self._first: float | None = None
        self._period: tuple[int, float] = (-1, 1.0)  # (index, factor) of the slow part now held

    def slow(self, now: float) -> float:
        """The slow part at ``now``: drawn from (seed, the period's index), so a period's factor is
        the same whatever requests came before it."""
        if self.spread <= 0 or self.period_s <= 0:
            return 1.0
        if self._first is None:
            self._first = now
        k = int((now - self._first) // self.period_s)
        if self._period[0] != k:
            z = float(np.random.default_rng([self.seed, 1, k]).standard_normal())
            self._period = (k, lognormal_factor(self.spread, z))
        return self._period[1]

    def factor(self, now: float) -> float:
        """The factor of a request starting at ``now`` (loop time, seconds)."""
        if self.spread <= 0:
            return 1.0
        return lognormal_factor(self.spread, float(self._per_request.standard_normal())) * self.slow(now)

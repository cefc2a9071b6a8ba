"""The step schedule: 1, 2, 4, 8 ... users, each step ramped, then held.

Each step's hold is timed from the moment all its users were actually running (Locust's
``spawning_complete``), not from a fixed schedule, so a slow ramp never eats into a step's
steady window.  The log of steps as applied is what steps.csv records.  Free of Locust (and
of gevent's monkey-patching), so it can be tested alone; shape.py adapts it to Locust.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

logger = logging.getLogger(__name__)


@dataclass
class StepRecord:
    index: int
    users: int
    t_ramp: float  # when the step's ramp began
    t_steady: float | None = None  # when all its users were running
    t_end: float | None = None  # when the next step began, or the load stopped

    def row(self) -> tuple:
        return (self.index, self.users, self.t_ramp, self.t_steady, self.t_end)


class StepSchedule:
    """The state machine behind StepShape, free of Locust so it can be tested alone."""

    def __init__(self, steps: list[int], ramp: float, hold: float, on_change: Callable[[list[StepRecord]], None] | None = None):
        self.steps, self.ramp, self.hold = list(steps), ramp, hold
        self.log: list[StepRecord] = []
        self.on_change = on_change or (lambda log: None)
        self.done = False

    def spawn_rate(self, i: int) -> float:
        delta = abs(self.steps[i] - (self.steps[i - 1] if i else 0))
        return max(1.0, delta / self.ramp) if self.ramp > 0 else float(max(delta, 1))

    def _begin(self, i: int, now: float) -> tuple[int, float]:
        if self.log:
            self.log[-1].t_end = now
        self.log.append(StepRecord(i, self.steps[i], now))
        self.on_change(self.log)
        logger.info("step %d: %d users (ramp %.1fs, hold %.1fs)", i, self.steps[i], self.ramp, self.hold)
        return self.steps[i], self.spawn_rate(i)

    def spawned(self, now: float) -> None:
        """All users of the current step are running."""
        if self.log and self.log[-1].t_steady is None:
            self.log[-1].t_steady = now
            self.on_change(self.log)

    def finish(self, now: float) -> None:
        if self.log and self.log[-1].t_end is None:
            self.log[-1].t_end = now
            self.on_change(self.log)
        self.done = True

    def tick(self, now: float, running_users: int) -> tuple[int, float] | None:
        if self.done:
            return None
        if not self.log:
            return self._begin(0, now)
        cur = self.log[-1]
        if cur.t_steady is None and running_users >= cur.users:
            self.spawned(now)  # spawning_complete was missed (e.g. a worker joined late)
        if cur.t_steady is not None and now >= cur.t_steady + self.hold:
            if cur.index + 1 >= len(self.steps):
                self.finish(now)
                return None
            return self._begin(cur.index + 1, now)
        return cur.users, self.spawn_rate(cur.index)

    def step_starts(self) -> list[tuple[float, int]]:
        return [(s.t_ramp, s.users) for s in self.log]

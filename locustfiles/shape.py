"""The step shape: 1, 2, 4, 8 ... users, each step ramped, then held.

Runs on the master (or the local runner) about once a second.  Each step's hold is timed
from the moment all its users were actually running (Locust's ``spawning_complete``), not
from a fixed schedule, so a slow ramp never eats into a step's steady window.  The log of
steps as applied is what steps.csv records.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

from locust import LoadTestShape

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


class StepShape(LoadTestShape):
    """Locust's view of the StepSchedule.

    Locust calls ``reset_time`` when a shape test starts (headless, or Start in the web UI),
    before the first ``tick``; that is where a new test gets its schedule from ``new_test``
    (set by the plugin at init), so the recording exists before the first user is spawned.
    """

    schedule: StepSchedule | None = None
    new_test: Callable[[], StepSchedule] | None = None

    def reset_time(self) -> None:
        super().reset_time()
        if self.new_test is not None and (self.schedule is None or self.schedule.done):
            self.schedule = self.new_test()

    def tick(self) -> tuple[int, float] | None:
        if self.schedule is None:
            logger.error("kneeswarm: the step shape has no plan; stopping")
            return None
        users = self.runner.user_count if self.runner is not None else 0
        return self.schedule.tick(time.time(), users)

"""The step shape: Locust's view of the StepSchedule (steps.py).

Runs on the master (or the local runner) about once a second.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import gevent
from locust import LoadTestShape

from kneeswarm.locustfiles.steps import StepSchedule

logger = logging.getLogger(__name__)

PREPARE_WAIT = 300.0  # seconds the first tick waits for a test's preparation (host agents starting)


class StepShape(LoadTestShape):
    """Locust's view of the StepSchedule.

    Locust calls ``reset_time`` when a shape test starts (headless, or Start in the web UI),
    before the first ``tick``; that is where a new test gets its schedule from ``new_test``
    (set by the plugin at init), so the recording exists before the first user is spawned.
    """

    schedule: StepSchedule | None = None
    new_test: Callable[[], StepSchedule] | None = None
    preparing = False  # new_test is running (it may wait on host agents): tick waits for it

    def reset_time(self) -> None:
        super().reset_time()
        if self.new_test is not None and (self.schedule is None or self.schedule.done):
            # Locust spawns the shape greenlet before calling this; new_test yields while the
            # host agents start, so the first tick must wait for the new schedule.
            self.preparing = True
            try:
                self.schedule = self.new_test()
            finally:
                self.preparing = False
            self.reset_time_base()

    def reset_time_base(self) -> None:
        LoadTestShape.reset_time(self)  # the test's clock starts once it is prepared

    def tick(self) -> tuple[int, float] | None:
        deadline = time.monotonic() + PREPARE_WAIT
        while self.preparing and time.monotonic() < deadline:
            gevent.sleep(0.1)
        if self.schedule is None:
            logger.error("kneeswarm: the step shape has no plan; stopping")
            return None
        users = self.runner.user_count if self.runner is not None else 0
        return self.schedule.tick(time.time(), users)

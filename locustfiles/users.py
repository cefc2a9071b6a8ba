"""The inference user: a closed-loop FastHttpUser that sends one protocol's requests.

The protocol (protocols/) builds bodies and judges answers; the recorder (recorder.py)
turns every request into a row.  This class only joins the two.
"""

from __future__ import annotations

import itertools
import logging

from locust import FastHttpUser, task

from locustfiles.protocols import PROTOCOLS, BadPayload
from locustfiles import state

logger = logging.getLogger(__name__)

_user_ids = itertools.count()


class InferenceUser(FastHttpUser):
    # FastHttpUser's defaults; the plan's request.timeout replaces these at init.
    network_timeout = 10.0
    connection_timeout = 10.0

    def wait_time(self) -> float:
        return state.plan().load.wait_ms / 1000.0

    def on_start(self) -> None:
        plan = state.plan()
        seed = next(_user_ids) + 100_000 * max(0, self.environment.runner.worker_index)  # Locust's index
        self.protocol = PROTOCOLS[plan.protocol](vars(plan.request), seed=seed)

    @task
    def infer(self) -> None:
        req = self.protocol.next_request()
        with self.client.request(
            req.method, req.path, data=req.body, headers=req.headers, catch_response=True, name="infer"
        ) as resp:
            if resp.status_code and 200 <= resp.status_code < 300:
                try:
                    self.protocol.check_response(resp.content)
                except BadPayload as e:
                    resp.failure(e)
            elif resp.status_code:
                resp.failure(f"HTTP {resp.status_code}")
            # status 0: a network error; Locust already carries the exception

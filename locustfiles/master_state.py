"""The master's own account of its workers and test, for the conductor (generator/master.json).

Kept from Locust's events by kneeswarm.locustfiles.plugin (worker_connect, test_start, the watch of missing
workers); read by kneeswarm.launch.conductor.workers_connected.  No Locust import here: the account is
plain data, and a test can write one without a gevent-patched process.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kneeswarm.contracts.rundir import MASTER_FILE, RunDir, write_json

logger = logging.getLogger(__name__)


class MasterState:
    """generator/master.json (MASTER_FILE) of a master the conductor started: how many workers
    are connected and whether the test started, kept from Locust's own events (worker_connect,
    test_start) and the watch of missing workers, so that the conductor learns why a run sent no
    load without reading Locust's log wording.  Without a conductor (no --kneeswarm-run-dir)
    nobody reads it, and nothing is written."""

    def __init__(self, env: Any):
        opts = env.parsed_options
        given = getattr(opts, "kneeswarm_run_dir", "") if opts else ""
        self.path = RunDir(given).generator_dir / MASTER_FILE if given else None
        self.expected = int(getattr(opts, "expect_workers", 0) or 0) if opts else 0
        self.ids: set[str] = set()
        self.started = False
        self._write()

    def connected(self, client_id: str) -> None:
        self.ids.add(client_id)
        self._write()

    def gone(self, client_id: str) -> None:
        if client_id in self.ids:
            self.ids.discard(client_id)
            self._write()

    def test_started(self) -> None:
        if not self.started:
            self.started = True
            self._write()

    def _write(self) -> None:
        if self.path is None:
            return
        try:
            write_json(self.path, {"workers_connected": len(self.ids), "workers_expected": self.expected,
                                   "test_started": self.started, "t": round(time.time(), 3)})
        except OSError as e:  # the conductor then says it does not know (and the run's own checks stand)
            logger.warning("kneeswarm: could not write %s: %s", self.path, e)

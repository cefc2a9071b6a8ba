"""Locust's master without its fixed pauses: it polls once a second for the expected workers
before a headless test starts, and each ``MasterRunner.quit`` (a headless shape run calls it
four times on the way out) sleeps 0.5 s "for the final stats report from all workers".  Here
the master waits for the workers as they come (a short poll at init) and ``quit`` waits only
until every worker told to quit has said so: a worker sends its final report before its
"quit" message on the same socket, so once it is gone its last rows are in.  Neither wait is
longer than Locust's own."""

from __future__ import annotations

import time
from typing import Any

import gevent
from locust.env import Environment
from locust.rpc import Message
from locust.runners import MasterRunner

POLL = 0.02  # seconds between looks at the master's workers
QUIT_WAIT = 0.5  # Locust's wait for the workers' final reports: the longest a quit waits here
# sha256 of the source of locust.runners.MasterRunner.quit that _quit copies (locust 2.47.0):
# tests/test_locustfiles.py fails when the installed Locust's differs, to have the copy re-checked
LOCUST_QUIT_SHA256 = "79b05b94ee3b9c30378d0a539f17b2801faa7c132d9684030311bf6d8837e578"


def _quit(self: MasterRunner) -> None:
    """``MasterRunner.quit`` (locust 2.47), its fixed 0.5 s sleep replaced by a wait for the workers."""
    self.stop(send_stop_to_client=False)
    told = [client.id for client in self.clients.all]
    for client_id in told:
        self.server.send_to_client(Message("quit", None, client_id))
    deadline = time.monotonic() + QUIT_WAIT
    while any(c in self.clients for c in told) and time.monotonic() < deadline:
        gevent.sleep(POLL)
    self.greenlet.kill(block=True)


def install() -> None:
    MasterRunner.quit = _quit  # type: ignore[method-assign]


def await_workers(env: Environment) -> None:
    """A headless master: until the expected workers are ready (or Locust's own limit passed,
    then Locust gives up at its first look), so that its 1 s poll finds them at once."""
    opts: Any = env.parsed_options
    runner = env.runner
    if not isinstance(runner, MasterRunner) or opts is None or not getattr(opts, "headless", False):
        return
    expect = int(getattr(opts, "expect_workers", 0) or 0)
    limit = float(getattr(opts, "expect_workers_max_wait", 0) or 0)
    start = time.monotonic()
    while len(runner.clients.ready) < expect:
        if limit and time.monotonic() - start > limit:
            opts.expect_workers_max_wait = 1e-9  # Locust's loop: "Gave up waiting for workers to connect"
            return
        gevent.sleep(POLL)

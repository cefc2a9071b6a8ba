"""A measuring locustfile loaded beside the one under test (``locust -f theirs.py,bench/window.py``).

Counts the process's requests and its own CPU time (``getrusage(RUSAGE_SELF)``: every thread of
this process, no children) over one steady window: from ``KNEESWARM_BENCH_WARM`` seconds after
all users run (Locust's first ``spawning_complete``), for ``KNEESWARM_BENCH_SPAN`` seconds, and
writes ``{"requests", "seconds", "cpu_s", "user_s", "sys_s"}`` to ``KNEESWARM_BENCH_OUT`` when Locust quits.  Both
sides of bench/generator.py load it, so both are measured the same way and start-up (kneeswarm's
host agents start before its first step) and shut-down stay out of the figures.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import time

import gevent
from locust import events

logger = logging.getLogger(__name__)

if os.environ.get("KNEESWARM_BENCH_CHANNEL", "user") != "user":  # bench/generator.py --channel worker
    from kneeswarm.locustfiles import grpcuser

    grpcuser.CHANNEL_SCOPE = os.environ["KNEESWARM_BENCH_CHANNEL"]

_count = 0
_window: dict[str, float] = {}
_started: list[bool] = []


def _cpu() -> tuple[float, float]:
    """(user, system) CPU seconds of this process, every thread."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


@events.request.add_listener
def _on_request(**_kw: object) -> None:
    global _count
    _count += 1


def _measure() -> None:
    gevent.sleep(float(os.environ.get("KNEESWARM_BENCH_WARM", "2")))
    n0, t0, c0 = _count, time.perf_counter(), _cpu()
    gevent.sleep(float(os.environ.get("KNEESWARM_BENCH_SPAN", "4")))
    c1 = _cpu()
    user_s, sys_s = c1[0] - c0[0], c1[1] - c0[1]
    _window.update(requests=_count - n0, seconds=time.perf_counter() - t0, cpu_s=user_s + sys_s, user_s=user_s,
                   sys_s=sys_s)


@events.spawning_complete.add_listener
def _on_spawning_complete(**_kw: object) -> None:
    if not _started:  # the first time every user runs: kneeswarm's plugin spawns its step only
        _started.append(True)  # after the host agents are up, bare Locust at once
        gevent.spawn(_measure)


@events.quitting.add_listener
def _on_quitting(**_kw: object) -> None:
    out = os.environ.get("KNEESWARM_BENCH_OUT")
    if out:
        with open(out, "w") as f:
            json.dump(_window, f)

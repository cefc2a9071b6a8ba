"""What every Locust process of a kneeswarm run knows: its plan and its place.

Set once at ``init`` (and on workers again when the master sends the plan at test start).
"""

from __future__ import annotations

from kneeswarm.plan import Plan

_plan: Plan = Plan()
_worker_index = 0


def plan() -> Plan:
    return _plan


def set_plan(p: Plan) -> None:
    global _plan
    _plan = p


def worker_index() -> int:
    return _worker_index


def set_worker_index(i: int) -> None:
    global _worker_index
    _worker_index = i

"""What every Locust process of a kneeswarm run knows: its plan.

Set once at ``init`` (and on workers again when the master sends the plan at test start).
A worker's place is Locust's own ``runner.worker_index``.
"""

from __future__ import annotations

from kneeswarm.contracts.plan import Plan

_plan: Plan = Plan()


def plan() -> Plan:
    return _plan


def set_plan(p: Plan) -> None:
    global _plan
    _plan = p


"""The plan's part the host agents need, as one object (instead of loose arguments).

    settings = AgentSettings.from_plan(plan, accept_new_host_keys=args.accept_new_host_keys)
"""

from __future__ import annotations

from dataclasses import dataclass

from kneeswarm.plan import HEARTBEAT_TIMEOUT, Plan

#: Added to the plan's duration for the agent's own time limit (the controller stops it first).
MAX_DURATION_MARGIN = 180.0


@dataclass(frozen=True)
class AgentSettings:
    interval: float = 1.0  # seconds between samples (plan.monitor.interval)
    heartbeat_timeout: float = HEARTBEAT_TIMEOUT  # the agent stops when the controller is silent this long
    max_duration: float = 3600.0  # seconds the load is planned to last
    metrics_url: str | None = None  # a host that lists ``prometheus`` scrapes this
    accept_new_host_keys: bool = False  # record an unknown SSH host key once (accept-new)

    @property
    def agent_max_duration(self) -> float:
        """The agent's own limit: the planned duration plus MAX_DURATION_MARGIN."""
        return self.max_duration + MAX_DURATION_MARGIN

    @classmethod
    def from_plan(cls, plan: Plan, accept_new_host_keys: bool = False) -> AgentSettings:
        return cls(interval=plan.monitor.interval, heartbeat_timeout=plan.monitor.heartbeat_timeout,
                   max_duration=plan.step_durations(), metrics_url=plan.metrics_url,
                   accept_new_host_keys=accept_new_host_keys)

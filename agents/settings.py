"""The plan's part the host agents need, as one object (instead of loose arguments).

    settings = AgentSettings.from_plan(plan, accept_new_host_keys=args.accept_new_host_keys)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kneeswarm.contracts.plan import Plan

from kneeswarm.agents.remote.defaults import DEFAULT_SCOPE, HEARTBEAT_TIMEOUT, INTERVAL, MAX_DURATION

#: Added to the plan's duration for the agent's own time limit (the controller stops it first).
MAX_DURATION_MARGIN = 180.0


@dataclass(frozen=True)
class AgentSettings:
    interval: float = INTERVAL  # seconds between samples (plan.monitor.interval)
    heartbeat_timeout: float = HEARTBEAT_TIMEOUT  # the agent stops when the controller is silent this long
    max_duration: float = MAX_DURATION  # seconds the load is planned to last
    metrics_url: str | None = None  # a host that lists ``prometheus`` scrapes this
    #: how a host's own scrape reaches metrics_url (``metrics_tls``): {verify, cadata, headers}
    metrics_tls: dict[str, Any] = field(default_factory=dict)
    accept_new_host_keys: bool = False  # record an unknown SSH host key once (accept-new)
    scope: str = DEFAULT_SCOPE  # which processes are the service where a host does not say (plan.monitor.scope)

    @property
    def agent_max_duration(self) -> float:
        """The agent's own limit: the planned duration plus MAX_DURATION_MARGIN."""
        return self.max_duration + MAX_DURATION_MARGIN

    @classmethod
    def from_plan(cls, plan: Plan, accept_new_host_keys: bool = False) -> AgentSettings:
        return cls(interval=plan.monitor.interval, heartbeat_timeout=plan.monitor.heartbeat_timeout,
                   max_duration=plan.step_durations(), metrics_url=plan.metrics_url,
                   metrics_tls=metrics_tls(plan), accept_new_host_keys=accept_new_host_keys,
                   scope=plan.monitor.scope)


def metrics_tls(plan: Plan) -> dict[str, Any]:
    """The plan's [endpoint] as a host's own scrape of metrics_url can use it: ``verify``, the CA
    bundle's text (``cadata``: the file is on this machine) and the headers written in the plan
    where metrics_url is the target's origin.  Not sent to a host: the client certificate's key
    and ``headers_env`` values (secrets stay on the load machine; the agent's config is a file
    there); {} when nothing applies."""
    e = plan.endpoint
    out: dict[str, Any] = {}
    if plan.metrics_url and plan.metrics_url.startswith("https://"):
        if not e.verify:
            out["verify"] = False
        if e.ca_bundle:
            out["cadata"] = Path(e.ca_bundle).read_text()
    headers = plan.metrics_headers(secrets=False)
    if headers:
        out["headers"] = headers
    return out

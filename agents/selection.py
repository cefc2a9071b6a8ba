"""Which collectors run on a host, from its preflight facts, and the agent config that runs them.

Every collector declares what it runs (``Collector.run_spec``: a command, or a sampler of the
remote agent with its parameters); this module only asks each one and turns the answers into plain
JSON for ``agents/remote/``. It never names a particular collector.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from kneeswarm.collectors import COLLECTORS, HostContext, RunSpec, Unavailable

from kneeswarm.agents.errors import AgentError
from kneeswarm.agents.settings import AgentSettings

logger = logging.getLogger(__name__)


@dataclass
class Selection:
    enabled: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> {"version", "raw_file", "kind"}
    skipped: dict[str, str] = field(default_factory=dict)  # name -> reason
    quiet: set[str] = field(default_factory=set)  # skipped as planned (a stand-in not needed): no warning
    news: list[str] = field(default_factory=list)  # skips worth a log line (logged once the host can run)
    specs: list[RunSpec] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {n: {"enabled": True, **v} for n, v in self.enabled.items()}
        out.update({n: {"enabled": False, "reason": r} for n, r in self.skipped.items()})
        return out


def check_argvs() -> dict[str, list[str]]:
    """The version-check argv of every collector that has one, for ``remote.pyz preflight``."""
    out = {}
    for name, c in COLLECTORS.items():
        argv = c.check_argv()
        if argv:
            out[name] = list(argv)
    return out


def select(facts: dict[str, Any], requested: list[str] | None, pid: int | None, settings: AgentSettings,
           label: str, scope: str | None = None, port: int | None = None) -> Selection:
    """Choose the collectors for one host; one that cannot run is skipped with its reason.
    ``scope``: which processes are the service there (default: ``settings.scope``); ``port``: its
    TCP port where known (the process was found by it)."""
    if requested is not None:
        unknown = [n for n in requested if n not in COLLECTORS]
        if unknown:
            raise AgentError(f"{label}: unknown collector(s) {', '.join(unknown)} "
                             f"(known: {', '.join(sorted(COLLECTORS))})")
    names = list(requested) if requested is not None else [n for n, c in COLLECTORS.items() if c.default]
    names.sort(key=lambda n: COLLECTORS[n].instead_of is not None)  # stand-ins after what they stand in for
    ctx = HostContext(facts, pid, settings.interval, settings.metrics_url, settings.metrics_tls,
                      scope=scope or settings.scope, port=port)
    sel = Selection()
    for name in names:
        c = COLLECTORS[name]
        if requested is None and c.instead_of in sel.enabled:
            sel.skipped[name] = f"{c.instead_of} runs (list {name} in the host's collectors to run both)"
            sel.quiet.add(name)
            continue
        try:
            spec = c.run_spec(ctx)
            if spec.sampler is not None and spec.sampler not in facts.get("samplers", [spec.sampler]):
                raise Unavailable(f"sampler {spec.sampler} needs the python agent, which this host cannot run")
        except Unavailable as e:
            sel.skipped[name] = str(e)
            if requested is not None or not c.needs_gpu:  # no GPU on a CPU host is no news
                sel.news.append(f"{label}: collector {name} skipped: {e}")
            continue
        sel.specs.append(spec)
        sel.enabled[name] = {"version": spec.version, "raw_file": c.raw_file, "kind": c.kind}
    if requested is None:  # a collector whose stand-in runs is no news (pidstat for the /proc sampler)
        covered = {str(COLLECTORS[n].instead_of) for n in sel.enabled} & set(sel.skipped)
        sel.quiet |= covered
        sel.news = [line for line in sel.news if not any(f"collector {n} skipped" in line for n in covered)]
    return sel


def agent_config(sel: Selection, settings: AgentSettings, run_id: str, pid: int | None) -> dict[str, Any]:
    """agent.json: what ``remote.pyz start`` reads."""
    return {
        "run_id": run_id,
        "interval": settings.interval,
        "heartbeat_timeout": settings.heartbeat_timeout,
        "max_duration": settings.agent_max_duration,
        "pid": pid,
        "collectors": [s.to_agent() for s in sel.specs],
    }

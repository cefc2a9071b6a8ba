"""Which collectors run on a host, from its preflight facts, and the agent config that runs them.

The agent (remote.py) knows nothing of the collectors registry; this module turns the registry
(``collectors.COLLECTORS``) and the preflight facts into plain JSON: argv + env of each command,
and the in-process samplers (procfs, nvml, prometheus) with their parameters.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from agents.errors import AgentError

logger = logging.getLogger(__name__)

#: Collectors left out unless a host lists them (alternatives to a default one, or need a URL).
#: The target's metrics_url is scraped from the load side by the conductor; a host runs the
#: ``prometheus`` sampler only when its ``collectors`` name it (e.g. a /metrics bound to the
#: server's loopback), writing hosts/<host>/raw/prometheus.jsonl on that host's clock.
NOT_BY_DEFAULT = frozenset({"query_gpu", "prometheus"})
#: Collectors that read the GPU: skipped on a host where preflight found none.
GPU_COLLECTORS = frozenset({"dmon", "query_gpu", "nvml"})


@dataclass
class Selection:
    enabled: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> {"version": ...}
    skipped: dict[str, str] = field(default_factory=dict)  # name -> reason
    commands: list[dict[str, Any]] = field(default_factory=list)
    samplers: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {n: {"enabled": True, **v} for n, v in self.enabled.items()}
        out.update({n: {"enabled": False, "reason": r} for n, r in self.skipped.items()})
        return out


def registry() -> dict[str, Any]:
    from collectors import COLLECTORS

    return COLLECTORS


def check_argvs() -> dict[str, list[str]]:
    """The version-check argv of every command collector, for ``remote.py preflight``."""
    out = {}
    for name, c in registry().items():
        if c.kind == "command":
            argv = c.check_argv()
            if argv:
                out[name] = list(argv)
    return out


def select(facts: dict[str, Any], requested: list[str] | None, pid: int | None, interval: float,
           label: str, metrics_url: str | None = None) -> Selection:
    """Choose the collectors for one host; a missing one is skipped with a warning."""
    reg = registry()
    if requested is not None:
        unknown = [n for n in requested if n not in reg]
        if unknown:
            raise AgentError(f"{label}: unknown collector(s) {', '.join(unknown)} (known: {', '.join(sorted(reg))})")
    names = list(requested) if requested is not None else [n for n in reg if n not in NOT_BY_DEFAULT]
    sel = Selection()
    has_gpu = bool(facts.get("gpus")) or bool((facts.get("nvml") or {}).get("available"))
    for name in names:
        c = reg[name]
        reason = None
        version = None
        if name in GPU_COLLECTORS and not has_gpu:
            reason = "no GPU found"
        elif c.kind == "command":
            tool = (facts.get("tools") or {}).get(name) or {}
            if not tool.get("found"):
                reason = tool.get("error") or "not installed"
            elif tool.get("rc") != 0:
                reason = tool.get("error") or f"{' '.join(c.check_argv() or [])} exited {tool.get('rc')}"
            else:
                version = c.version_from(tool.get("output") or "")
                try:
                    cmd = c.command(pid, interval, version)
                except Exception as e:  # e.g. pidstat without a pid to monitor
                    cmd, reason = None, str(e)
                if cmd is None and reason is None:
                    reason = "no command for this host"
                if cmd is not None:
                    argv, env = cmd
                    sel.commands.append({"name": name, "argv": list(argv), "env": dict(env or {}),
                                         "raw_file": c.raw_file})
        elif name == "procfs":
            if pid is None:
                reason = "no monitored process (give pid, process or port)"
            elif not facts.get("procfs"):
                reason = "/proc is not available"
            else:
                sel.samplers.append({"name": name, "pid": pid, "raw_file": c.raw_file, "interval": interval})
        elif name == "nvml":
            nv = facts.get("nvml") or {}
            if not nv.get("available"):
                reason = nv.get("error") or "NVML not available"
            else:
                version = nv.get("driver")
                sel.samplers.append({"name": name, "raw_file": c.raw_file, "interval": interval})
        elif name == "prometheus":
            if not metrics_url:
                reason = "no metrics_url"
            else:
                sel.samplers.append({"name": name, "url": metrics_url, "raw_file": c.raw_file, "interval": interval})
        else:
            reason = f"sampler {name!r} is not implemented by the agent"
        if reason:
            sel.skipped[name] = reason
            if requested is not None or name not in GPU_COLLECTORS:
                logger.warning("%s: collector %s skipped: %s", label, name, reason)
        else:
            sel.enabled[name] = {"version": version, "raw_file": c.raw_file, "kind": c.kind}
    return sel


def agent_config(sel: Selection, interval: float, heartbeat_timeout: float, max_duration: float,
                 run_id: str, pid: int | None) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "interval": interval,
        "heartbeat_timeout": heartbeat_timeout,
        "max_duration": max_duration,
        "pid": pid,
        "commands": sel.commands,
        "samplers": sel.samplers,
    }

"""The controller side of one monitored host, along its lifecycle.

    agent = open_agent(host_plan, run, AgentSettings(interval=1, max_duration=600))
    facts = agent.preflight()        # raises AgentError (one line) if the host or process is not there
    agent.start()                    # clock offset, agent.json, the remote agent, heartbeats
    agent.fetch()                    # incremental, any time during the run
    agent.stop(); agent.fetch(final=True)   # checksums verified; remote dir removed after a match
    stats = agent.write_parsed()     # hosts/<host>/<table>.csv on the master's clock
    meta = agent.meta()              # for meta.json["hosts"][label]
    agent.close()

The pieces: ``kneeswarm.agents.deploy`` (upload, preflight, start, stop, clock), ``kneeswarm.agents.heartbeat`` (the
watch channel in a thread), ``kneeswarm.agents.fetch`` (copy home, verify), over one ``kneeswarm.agents.link``
(retries, reconnects). The transport (local subprocess or SSH) is the only difference between
``local`` and a remote server. ``kneeswarm.agents.hosts.HostAgents`` drives several hosts at once.
"""

from __future__ import annotations

import logging
from typing import Any

from kneeswarm.contracts.plan import HostPlan
from kneeswarm.contracts.rundir import RunDir, WarningLog

from kneeswarm.collectors.parsed import LiveParse, write_parsed_csvs

from kneeswarm.agents.deploy import Deployment
from kneeswarm.agents.fetch import Fetcher
from kneeswarm.agents.heartbeat import Heartbeat
from kneeswarm.agents.link import HostLink
from kneeswarm.agents.errors import AgentError
from kneeswarm.agents.settings import AgentSettings
from kneeswarm.agents.transport import Transport

logger = logging.getLogger(__name__)

MAX_HOST_WARNINGS = 50  # warnings kept per host for meta.json (the rest are counted)


def make_transport(host: HostPlan, accept_new_host_keys: bool = False, lifetime: float | None = None) -> Transport:
    """The transport the plan names for ``host``: ssh, an exec prefix (``exec``, or the one the
    ``kubernetes`` table builds), else this machine.  ``lifetime``: seconds a debug container the
    transport starts may live (the agent's own limit)."""
    python = [host.python] if host.python else None
    if host.kubernetes is not None:
        from kneeswarm.agents.kubernetes import KubernetesTarget

        return KubernetesTarget.from_plan(host).transport(host.label, python, lifetime)
    if host.exec is not None:
        from kneeswarm.agents.exec import ExecTransport

        return ExecTransport(host.exec, host.label, python)
    if host.ssh is None:
        from kneeswarm.agents.local import LocalTransport

        return LocalTransport(label=host.label, python=python)
    from kneeswarm.agents.ssh import SSHTransport

    return SSHTransport.from_plan(host, accept_new_host_keys=accept_new_host_keys)


def open_agent(host: HostPlan, run: RunDir, settings: AgentSettings | None = None,
               transport: Transport | None = None) -> HostAgent:
    """A HostAgent for ``host`` (connected: an unreachable host raises AgentError here)."""
    settings = settings or AgentSettings()
    return HostAgent(host, run, transport or make_transport(host, settings.accept_new_host_keys, settings.agent_max_duration),
                     settings)


class HostAgent:
    def __init__(self, host: HostPlan, run: RunDir, transport: Transport, settings: AgentSettings):
        self.host = host
        self.label = host.label
        self.run = run
        self.settings = settings
        self.warnings = WarningLog(MAX_HOST_WARNINGS)
        self.link = HostLink(self.label, transport, run.path.name)
        self.deploy = Deployment(self.link, host, settings, self.warnings)
        self.heartbeat = Heartbeat(self.link, settings.heartbeat_timeout, self.warnings)
        self.fetcher = Fetcher(self.link, run.raw_dir(self.label), host.keep_remote, self.warnings)
        self.parse_info: dict[str, Any] | None = None  # {collector: {"lines", "skipped", "error", "tables"}}
        self.parsed_verified: bool | None = None  # whether what was parsed had all matched the manifest
        self.live_parse: LiveParse | None = None  # the live view's parse during the run (write_parsed(live=True))

    # what tests and callers read
    t = property(lambda self: self.link.t)
    remote_dir = property(lambda self: self.link.remote_dir)
    clock = property(lambda self: self.deploy.clock)
    start_status = property(lambda self: self.deploy.start_status)
    fetch_info = property(lambda self: self.fetcher.info)
    started = property(lambda self: self.deploy.started)
    stopped = property(lambda self: self.deploy.stopped)

    def bare(self, e: BaseException) -> str:
        return self.link.bare(e)

    # -- lifecycle -------------------------------------------------------------------------
    def preflight(self) -> dict[str, Any]:
        """Facts about the host (for meta.json); AgentError if it cannot be monitored."""
        self.deploy.preflight()
        return self.deploy.facts_summary() or {}

    def start(self) -> dict[str, Any]:
        """Measure the clock, start the remote agent and the heartbeat thread."""
        status = self.deploy.start()
        self.run.raw_dir(self.label).mkdir(parents=True, exist_ok=True)
        try:
            self.heartbeat.start()
        except AgentError:
            self.deploy.stop()
            raise
        assert self.deploy.selection is not None
        logger.info("%s: agent started in %s (%s)", self.label, self.remote_dir,
                    ", ".join(self.deploy.selection.enabled))
        return status

    def fetch(self, final: bool = False) -> dict[str, int]:
        """Incremental fetch; ``final=True`` (after stop): verified, never raises for lost data."""
        return self.fetcher.fetch_final() if final else self.fetcher.fetch()

    def stop(self) -> dict[str, Any]:
        """Stop the heartbeats, then the remote agent and its collectors."""
        self.heartbeat.stop()
        return self.deploy.stop()

    def write_parsed(self, live: bool = False) -> dict[str, Any]:
        """Parse the raw files into hosts/<host>/<table>.csv (master's clock); per-collector stats.

        Runs on whatever arrived (meta's ``parsed_verified`` says whether it all matched the
        manifest); a parser that raised has its ``error`` in the stats and counts in ``lost``.
        ``live``: during the run, for the live view: only what arrived since the last call is
        parsed where that is the cost (kneeswarm.collectors.parsed.LiveParse); the final parse is whole."""
        sel = self.deploy.selection
        enabled = list(sel.enabled) if sel else None
        if live:
            if self.live_parse is None:
                self.live_parse = LiveParse(self.run, self.label, self.settings.interval)
            self.parse_info = self.live_parse.update(self.clock, enabled)
        else:
            self.parse_info = write_parsed_csvs(self.run, self.label, self.clock, enabled,
                                                interval=self.settings.interval)
        self.parsed_verified = bool(self.fetch_info.get("verified"))
        return self.parse_info

    # -- the record ------------------------------------------------------------------------
    def lost(self) -> dict[str, int]:
        """What this host lost, by kind ({} when nothing)."""
        out = dict(self.fetcher.lost)
        errors = sum(1 for st in (self.parse_info or {}).values() if st.get("error"))
        if errors:
            out["parser_errors"] = errors
        return out

    def meta(self) -> dict[str, Any]:
        """What meta.json["hosts"][label] should hold."""
        lost = self.lost()
        return {
            "complete": not lost and (not self.started or bool(self.fetch_info.get("verified"))),
            "lost": lost,
            "transport": self.t.kind,
            "agent": self.link.flavor.to_dict() if self.deploy.probed else None,
            "transfer": self.t.transfer,
            "ssh": self.host.ssh,
            "jump": self.host.jump,
            "exec": self.t.describe() if self.t.kind == "exec" else None,
            "remote_dir": self.remote_dir,
            "pid": self.deploy.pid,
            "facts": self.deploy.facts_summary(),
            "collectors": self.deploy.selection.to_dict() if self.deploy.selection else {},
            "warnings": self.warnings.to_list(),
            "clock": {**self.clock.to_dict(), "errors": self.deploy.clock_errors},
            "stop": self.deploy.stop_info,
            "fetch": self.fetch_info,
            # a verified agent directory that could not be removed: still on the server
            "left_on_server": self.remote_dir if self.fetch_info.get("removal_error") else None,
            "parse": self.parse_info,
            "parsed_verified": self.parsed_verified,
            "reconnects": self.link.reconnects,
            "heartbeat_failures": self.heartbeat.failures,
            "fetches_postponed": self.fetcher.postponed,
            "warnings_dropped": self.warnings.dropped,
        }

    def close(self) -> None:
        self.heartbeat.stop()
        self._remove_unstarted()
        try:
            self.t.close()
        except Exception as e:  # closing must never raise over the real error
            logger.debug("%s: close: %s", self.label, e)

    def _remove_unstarted(self) -> None:
        """An agent uploaded but never started (a preflight refused the host) leaves nothing on
        it: its directory holds only the agent and its preflight config (no data to keep)."""
        if self.remote_dir is None or self.started or self.host.keep_remote:
            return
        try:
            self.t.remove_tree(self.remote_dir)
            self.link.remote_dir = None
        except Exception as e:  # closing must never raise over the real error
            logger.warning("%s: removing the unused agent directory %s: %s", self.label, self.remote_dir, e)

    def __enter__(self) -> HostAgent:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.started and not self.stopped:
            try:
                self.stop()
                self.fetch(final=True)
            except AgentError as e:
                logger.warning("%s: %s", self.label, e)
        self.close()

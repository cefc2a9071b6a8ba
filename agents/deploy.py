"""Deploying the agent on one host: upload remote.pyz, preflight (facts, collectors), start (clock
offset, agent.json, ``remote.pyz start``), and stop (``remote.pyz stop``, clock offset again)."""

from __future__ import annotations

import logging
from typing import Any

from kneeswarm.contracts.plan import HostPlan
from kneeswarm.contracts.rundir import WarningLog

from kneeswarm.agents import clock, selection, shellagent
from kneeswarm.agents.errors import AgentError
from kneeswarm.agents.link import HostLink
from kneeswarm.agents.settings import AgentSettings

logger = logging.getLogger(__name__)

PREFLIGHT_TIMEOUT = 60.0
START_TIMEOUT = 40.0
STOP_TIMEOUT = 60.0
STOP_WINDOW = 120.0  # seconds stop keeps retrying a lost connection


class Deployment:
    def __init__(self, link: HostLink, host: HostPlan, settings: AgentSettings, warnings: WarningLog):
        self.link = link
        self.host = host
        self.settings = settings
        self.warnings = warnings
        self.facts: dict[str, Any] | None = None
        self.pid: int | None = None
        self.selection: selection.Selection | None = None
        self.clock = clock.ClockCorrection()
        self.clock_errors: list[str] = []
        self.start_status: dict[str, Any] | None = None
        self.stop_info: dict[str, Any] | None = None
        self.started = self.stopped = False
        self.probed = False

    @property
    def scope(self) -> str:
        """Which processes are the service on this host: its own ``scope``, else the plan's."""
        return self.host.scope or self.settings.scope

    def probe(self) -> shellagent.AgentFlavor:
        """Which agent this host runs (once): remote.pyz, or remote.sh where python3 is absent or
        older than MIN_PYTHON (the host's warnings then say what that lost)."""
        if not self.probed:
            flavor = self.link.retry(lambda: shellagent.probe(self.link.t, self.link.label), 10.0, "python3 probe")
            self.link.flavor = flavor
            self.link.t.shell_file_ops = flavor.kind == "shell"
            self.probed = True
            if (note := flavor.note()) is not None:
                self.warnings.add(note)
        return self.link.flavor

    def upload(self) -> None:
        """remote.pyz (or remote.sh) into the per-run agent directory (once)."""
        if self.link.remote_dir is not None:
            return
        flavor = self.probe()
        remote_dir = self.link.t.run_root(self.link.run_id, self.link.label)
        script = flavor.source()

        def up() -> None:
            self.link.t.makedirs(remote_dir)
            self.link.t.put(f"{remote_dir}/{flavor.script}", script, 0o755)

        self.link.retry(up, 10.0, f"upload of {flavor.script}")
        self.link.remote_dir = remote_dir

    def preflight(self) -> dict[str, Any]:
        """Facts about the host; AgentError if it cannot be monitored."""
        self.upload()
        h = self.host
        cfg: dict[str, Any] = {"checks": selection.check_argvs(), "pid": h.pid, "process": h.process, "port": h.port,
                               "scope": self.scope}
        name, data = self.link.flavor.preflight_config(cfg)
        self.link.put(name, data)
        facts = self.link.call("preflight", self.link.path(name), PREFLIGHT_TIMEOUT, wrapper=[])
        proc = facts.get("process") or {}
        if proc.get("error"):
            raise AgentError(f"{self.link.label}: monitored process: {proc['error']}")
        self.pid = proc.get("pid")
        if self.pid is None:
            self.warnings.add("no monitored process (give pid, process or port): host-wide collectors only")
        self.facts = facts
        self.selection = selection.select(facts, h.collectors, self.pid, self.settings, self.link.label,
                                          scope=self.scope, port=h.port if proc.get("by") == "port" else None)
        for name, reason in self.selection.skipped.items():
            if name not in self.selection.quiet:
                self.warnings.add(f"collector {name} skipped: {reason}")
        way_out = f"; {self.link.t.way_out}" if self.link.t.way_out else ""
        if not self.selection.enabled and self.link.flavor.kind == "shell":
            tools = sorted({argv[0] for argv in cfg["checks"].values()})
            raise AgentError(f"{self.link.label}: cannot be monitored: {self.link.flavor.why} and none of "
                             f"{', '.join(tools)} is installed (without python3 only those can run){way_out}")
        if not self.selection.enabled:
            raise AgentError(f"{self.link.label}: no collector can run "
                             f"({'; '.join(self.warnings) or 'none available'}){way_out}")
        for line in self.selection.news:  # after the checks above: a host refused is one line
            logger.warning("%s", line)
        return self.facts

    def measure_clock(self) -> clock.ClockOffset | None:
        """One offset measurement over a fresh echo process; None (and a note) if it fails."""
        self.upload()
        echo = None
        try:
            echo = self.link.open_echo()
            with self.link.lock:
                return clock.measure(echo, label=self.link.label)
        except AgentError as e:
            self.clock_errors.append(str(e))
            logger.warning("%s: clock offset not measured: %s", self.link.label, e)
            return None
        finally:
            if echo is not None:
                try:
                    echo.close()
                except Exception as e:  # closing a dead channel must not hide the result
                    logger.debug("%s: closing echo: %s", self.link.label, e)

    def start(self) -> dict[str, Any]:
        """Measure the clock, write agent.json and start the remote agent."""
        if self.selection is None:
            self.preflight()
        assert self.selection is not None
        self.clock.before = self.measure_clock()
        cfg = selection.agent_config(self.selection, self.settings, self.link.run_id, self.pid)
        name, data = self.link.flavor.start_config(cfg)
        self.link.put(name, data)
        out = self.link.call("start", self.link.path(name), START_TIMEOUT)
        self.started = True
        self.start_status = out.get("status") or {}
        for name, c in (self.start_status.get("collectors") or {}).items():
            if c.get("error") or not c.get("running"):
                msg = f"collector {name} not running: {c.get('error') or 'exited with ' + str(c.get('exit_code'))}"
                self.warnings.add(msg)
                logger.warning("%s: %s", self.link.label, msg)
        return self.start_status

    def stop(self) -> dict[str, Any]:
        """Stop the remote agent and its collectors (MANIFEST.json written), then measure the clock again."""
        if not self.started or self.stopped:
            return self.stop_info or {}
        out = self.link.call("stop", self.link.remote_dir, STOP_TIMEOUT, window=STOP_WINDOW)
        self.stopped = True
        st = out.get("status") or {}
        self.stop_info = {
            "reason": out.get("reason"),
            "killed": out.get("killed") or [],
            "collectors": {n: {k: c.get(k) for k in ("exit_code", "bytes", "error", "lines") if k in c}
                           for n, c in (st.get("collectors") or {}).items()},
        }
        self.clock.after = self.measure_clock()
        return self.stop_info

    def facts_summary(self) -> dict[str, Any] | None:
        """The facts for meta.json: tools with the version each collector found, and the selection."""
        if self.facts is None:
            return None
        f = {k: v for k, v in self.facts.items() if k not in ("ok", "tools")}
        enabled = self.selection.enabled if self.selection else {}
        f["tools"] = {n: {"found": t.get("found"), "path": t.get("path"),
                          "version": enabled.get(n, {}).get("version"), "error": t.get("error")}
                      for n, t in (self.facts.get("tools") or {}).items()}
        f["collectors"] = self.selection.to_dict() if self.selection else {}
        return f

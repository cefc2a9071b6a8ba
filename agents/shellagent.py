"""Which agent a host runs, and the shell agent's side of it.

The agent is ``remote.pyz`` wherever the host's python3 is 3.6 or newer. Where python3 is older or
absent (minimal and distroless containers, appliances), ``remote.sh`` stands in: the same verbs,
files and answers, in POSIX sh, so deploy, heartbeat, fetch and the clock drive it unchanged. It
runs the collectors that are commands (pidstat, vmstat, nvidia-smi) over the SSH exec channel with
the same raw files, clock offsets, watch-channel stop and verified fetch; the samplers of
``remote.pyz`` (the /proc sampler, NVML, the Prometheus scrape) are what the host loses.

    flavor = probe(transport)            # PYTHON_AGENT, or a ShellAgent saying why
    flavor.config(cfg)                   # the file its preflight / start reads
"""

from __future__ import annotations

import json
import logging
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kneeswarm.collectors import COLLECTORS

from kneeswarm.agents.errors import AgentError, TransportError
from kneeswarm.agents.bundle import agent_zipapp
from kneeswarm.agents.remote.defaults import SCRIPT_FILE
from kneeswarm.agents.transport import Transport

logger = logging.getLogger(__name__)

#: The oldest python3 remote.pyz runs on (RHEL 8 and Ubuntu 18.04 ship 3.6).
MIN_PYTHON = (3, 6)
PROBE_TIMEOUT = 30.0
#: Prints "major.minor" on any python (2.x included); no -I: older than 3.4 does not know it.
PROBE_CODE = "import sys; sys.stdout.write('%d.%d' % sys.version_info[:2])"
SHELL_SCRIPT = "remote.sh"
SHELL_PREFLIGHT_FILE = "preflight.conf"
SHELL_CONFIG_FILE = "agent.conf"


@dataclass(frozen=True)
class AgentFlavor:
    """How the agent is run on one host: the script uploaded, its interpreter, its config files."""

    kind: str  # "python" or "shell"
    script: str
    why: str | None = None  # shell: why the python agent cannot run
    python: str | None = None  # the host's python3 version ("3.6"), None when absent

    def source(self) -> bytes:
        """What is uploaded: the python agent's zipapp (agents/bundle.py), or remote.sh."""
        if self.kind == "python":
            return agent_zipapp()
        return (Path(__file__).with_name(self.script)).read_bytes()

    def interpreter(self, t: Transport) -> list[str]:
        return list(t.python) if self.kind == "python" else ["sh"]

    def preflight_config(self, cfg: dict[str, Any]) -> tuple[str, bytes]:
        """(file name, content) of what ``preflight`` reads."""
        from kneeswarm.agents.remote.defaults import PREFLIGHT_FILE

        if self.kind == "python":
            return PREFLIGHT_FILE, json.dumps(cfg).encode()
        lines = [f"check {shlex.quote(name)} {shlex.join(argv)}" for name, argv in (cfg.get("checks") or {}).items()]
        for key in ("pid", "process", "port", "scope"):
            if cfg.get(key) is not None:
                lines.append(f"{key.upper()}={shlex.quote(str(cfg[key]))}")
        return SHELL_PREFLIGHT_FILE, ("\n".join(lines) + "\n").encode()

    def start_config(self, cfg: dict[str, Any]) -> tuple[str, bytes]:
        """(file name, content) of what ``start`` reads (the shell agent: commands only)."""
        from kneeswarm.agents.remote.defaults import CONFIG_FILE

        if self.kind == "python":
            return CONFIG_FILE, json.dumps(cfg, indent=1).encode()
        lines = [f"HEARTBEAT_TIMEOUT={max(1, round(float(cfg['heartbeat_timeout'])))}",
                 f"MAX_DURATION={max(1, round(float(cfg['max_duration'])))}"]
        for c in cfg.get("collectors") or []:
            if c.get("argv") is None:
                raise AgentError(f"the shell agent cannot run sampler {c.get('name')!r}")
            env = [f"{k}={v}" for k, v in (c.get("env") or {}).items()]
            argv = (["env", *env] if env else []) + list(c["argv"])
            lines.append(f"collector {shlex.quote(c['name'])} {shlex.quote(c['raw_file'])} {shlex.join(argv)}")
        return SHELL_CONFIG_FILE, ("\n".join(lines) + "\n").encode()

    def lost(self) -> list[str]:
        """Collectors this agent cannot run (the samplers of remote.pyz), by name."""
        return [] if self.kind == "python" else sorted(n for n, c in COLLECTORS.items() if c.kind == "sampler")

    def to_dict(self) -> dict[str, Any]:
        """meta.json["hosts"][label]["agent"]."""
        out: dict[str, Any] = {"kind": self.kind, "script": self.script, "python": self.python}
        if self.kind == "shell":
            out.update(why=self.why, lost=self.lost())
        return out

    def note(self) -> str | None:
        """The host's warning line when it runs without the python agent."""
        if self.kind == "python":
            return None
        return (f"ran without the python agent ({self.why}): the shell agent ran the command collectors; "
                f"lost: {', '.join(self.lost())} (the in-process samplers, e.g. the /proc sampler)")


PYTHON_AGENT = AgentFlavor("python", SCRIPT_FILE)


def _version(text: str) -> tuple[int, int] | None:
    m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def probe(t: Transport, label: str) -> AgentFlavor:
    """The agent this host can run: remote.pyz where python3 >= MIN_PYTHON, else remote.sh."""
    python = " ".join(t.python)
    try:
        res = t.run([*t.python, "-c", PROBE_CODE], PROBE_TIMEOUT)
    except TransportError:
        raise
    except AgentError as e:
        raise AgentError(f"{label}: probing {python}: {e}") from None
    version = _version(res.stdout.decode("utf-8", "replace")) if res.rc == 0 else None
    need = f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]}"
    if version is None:
        missing = f"{python} is not on the host's PATH" if "/" not in python else f"{python} is not on the host"
        why = missing if res.rc == 127 else f"{python} did not run ({res.err_line()})"
        logger.info("%s: %s: monitoring it with the shell agent", label, why)
        return AgentFlavor("shell", SHELL_SCRIPT, why=why)
    shown = f"{version[0]}.{version[1]}"
    if version < MIN_PYTHON:
        why = f"{python} is {shown}; the python agent needs {need} or newer"
        logger.info("%s: %s: monitoring it with the shell agent", label, why)
        return AgentFlavor("shell", SHELL_SCRIPT, why=why, python=shown)
    return AgentFlavor("python", SCRIPT_FILE, python=shown)

"""SSH deployment and lifecycle of the remote agent; clock offsets (floor 3).

``agents.remote`` is the agent itself (one stdlib-only file uploaded to each server);
``agents.host`` drives it for one host (``deploy``, ``heartbeat``, ``fetch`` over a ``link``) and
``agents.hosts`` for all of a run's hosts at once, over a transport (``agents.local`` or
``agents.ssh``); ``agents.clock`` measures each host's clock offset.
"""

from __future__ import annotations

from collectors.parsed import write_parsed_csvs

from agents.errors import AgentError, HostKeyError, TransportError
from agents.host import HostAgent, open_agent
from agents.hosts import HostAgents
from agents.settings import AgentSettings

__all__ = ["AgentError", "AgentSettings", "HostAgent", "HostAgents", "HostKeyError", "TransportError",
           "open_agent", "write_parsed_csvs"]

"""SSH deployment and lifecycle of the remote agent; clock offsets (floor 3).

``agents.remote`` is the agent itself (one stdlib-only file uploaded to each server);
``agents.host`` drives it from the controller over a transport (``agents.local`` or
``agents.ssh``); ``agents.clock`` measures each host's clock offset.
"""

from __future__ import annotations

from agents.errors import AgentError, HostKeyError, TransportError
from agents.host import HostAgent, HostAgents, open_agent, write_parsed_csvs

__all__ = ["AgentError", "HostAgent", "HostAgents", "HostKeyError", "TransportError", "open_agent",
           "write_parsed_csvs"]

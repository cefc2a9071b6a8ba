"""SSH deployment and lifecycle of the remote agent; clock offsets (floor 3).

``agents.remote`` is the agent itself (a stdlib-only package, floor 0, packed by ``agents.bundle``
into one zipapp uploaded to each server; its ``defaults`` are imported by the controller side and
by the plan); ``agents.host`` drives it for one host (``deploy``, ``heartbeat``, ``fetch`` over a
``link``) and ``agents.hosts`` for all of a run's hosts at once, over a transport
(``agents.local`` or ``agents.ssh``); ``agents.clock`` measures each host's clock offset.

The names below are imported when first used (PEP 562), so that ``agents.remote.defaults`` can be
imported by the plan (floor 1) without loading the controller side, which imports the plan.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collectors.parsed import write_parsed_csvs

    from agents.errors import AgentError, HostKeyError, TransportError
    from agents.host import HostAgent, open_agent
    from agents.hosts import HostAgents
    from agents.settings import AgentSettings

#: name -> the module that defines it
_EXPORTS = {"AgentError": "agents.errors", "HostKeyError": "agents.errors", "TransportError": "agents.errors",
            "HostAgent": "agents.host", "open_agent": "agents.host", "HostAgents": "agents.hosts",
            "AgentSettings": "agents.settings", "write_parsed_csvs": "collectors.parsed"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agents' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

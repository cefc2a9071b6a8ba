"""SSH deployment and lifecycle of the remote agent; clock offsets (floor 3).

``kneeswarm.agents.remote`` is the agent itself (a stdlib-only package, floor 0, packed by ``kneeswarm.agents.bundle``
into one zipapp uploaded to each server; its ``defaults`` are imported by the controller side and
by the plan); ``kneeswarm.agents.host`` drives it for one host (``deploy``, ``heartbeat``, ``fetch`` over a
``link``) and ``kneeswarm.agents.hosts`` for all of a run's hosts at once, over a transport
(``kneeswarm.agents.local`` or ``kneeswarm.agents.ssh``); ``kneeswarm.agents.clock`` measures each host's clock offset.

The names below are imported when first used (PEP 562), so that ``kneeswarm.agents.remote.defaults`` can be
imported by the plan (floor 1) without loading the controller side, which imports the plan.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kneeswarm.collectors.parsed import write_parsed_csvs

    from kneeswarm.agents.errors import AgentError, HostKeyError, TransportError
    from kneeswarm.agents.host import HostAgent, open_agent
    from kneeswarm.agents.hosts import HostAgents
    from kneeswarm.agents.settings import AgentSettings

#: name -> the module that defines it
_EXPORTS = {"AgentError": "kneeswarm.agents.errors", "HostKeyError": "kneeswarm.agents.errors", "TransportError": "kneeswarm.agents.errors",
            "HostAgent": "kneeswarm.agents.host", "open_agent": "kneeswarm.agents.host", "HostAgents": "kneeswarm.agents.hosts",
            "AgentSettings": "kneeswarm.agents.settings", "write_parsed_csvs": "kneeswarm.collectors.parsed"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agents' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

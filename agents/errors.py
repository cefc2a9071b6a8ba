"""Errors of the agents package: one line for the user, never a traceback."""

from __future__ import annotations


class AgentError(RuntimeError):
    """A host agent that cannot do what was asked; str() is one line naming the host and the cause."""


class TransportError(AgentError):
    """The connection to a host failed (unreachable, dropped, timed out); may be retried."""


class HostKeyError(AgentError):
    """A host key that is unknown or has changed; never retried."""

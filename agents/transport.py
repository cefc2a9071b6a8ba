"""How the controller reaches a host: the small interface shared by the local, SSH and exec transports.

Every path given to a transport is a path on the host; relative paths are relative to the
user's home directory (where SSH commands and SFTP start), absolute ones are taken as they are.
Every operation is bounded in time; failures raise ``TransportError`` (retryable) or
``AgentError`` (not).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass

logger = logging.getLogger(__name__)


@dataclass
class CommandResult:
    rc: int
    stdout: bytes
    stderr: bytes

    def err_line(self) -> str:
        """The last non-empty line of stderr (or stdout), for one-line error messages."""
        for stream in (self.stderr, self.stdout):
            lines = [ln.strip() for ln in stream.decode("utf-8", "replace").splitlines() if ln.strip()]
            if lines:
                return lines[-1][:300]
        return f"exit code {self.rc}"


class EchoChannel(ABC):
    """A long-lived remote process fed lines on stdin, answering lines on stdout
    (``remote.pyz echo`` for the clock, ``remote.pyz watch`` for the heartbeat)."""

    @abstractmethod
    def send(self, line: bytes) -> None: ...

    @abstractmethod
    def recv_line(self, timeout: float) -> bytes: ...

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def closed_within(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; True as soon as the channel closes (the process
        exited or the connection died), False if it is still open."""


class Transport(ABC):
    """A way to run commands and move files on one host."""

    kind: str = "?"
    label: str = "?"
    python: list[str] = ["python3"]
    #: How files move: "local", "sftp" or "exec" (no sftp subsystem); None until first used.
    transfer: str | None = None
    #: File operations through the exec channel in sh rather than python3 (a host without it).
    shell_file_ops: bool = False
    #: What to do where the host can run neither the python agent nor a collector's tool (the exec
    #: transport: a debug container); said in that error's line. None: nothing to add.
    way_out: str | None = None

    @abstractmethod
    def run_root(self, run_id: str, label: str) -> str:
        """The per-run agent directory on the host (not yet created)."""

    @abstractmethod
    def run(self, argv: list[str], timeout: float, stdin: bytes | None = None) -> CommandResult:
        """Run argv to completion (stdout and stderr read concurrently), within ``timeout``."""

    @abstractmethod
    def makedirs(self, path: str) -> None: ...

    @abstractmethod
    def put(self, path: str, data: bytes, mode: int = 0o644) -> None: ...

    @abstractmethod
    def sizes(self, path: str) -> dict[str, int]:
        """Regular files directly in ``path`` and their sizes."""

    @abstractmethod
    def read_range(self, path: str, offset: int, length: int) -> bytes: ...

    @abstractmethod
    def remove_tree(self, path: str) -> None: ...

    @abstractmethod
    def open_echo(self, argv: list[str]) -> EchoChannel: ...

    def reconnect(self) -> None:
        """Re-establish the connection (no-op where there is none)."""

    def close(self) -> None:
        """Release the connection; processes started detached keep running."""

    def describe(self) -> str:
        return f"{self.kind}:{self.label}"

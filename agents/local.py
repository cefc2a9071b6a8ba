"""The ``local`` transport: the agent on this machine, without SSH, through subprocess.

The agent directory is a temporary directory; the controller fetches from it exactly as it
fetches over SFTP, so ``local`` and remote hosts share one code path.
"""

from __future__ import annotations

import logging
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kneeswarm.agents.errors import AgentError, TransportError
from kneeswarm.agents.transport import CommandResult, EchoChannel, Transport

logger = logging.getLogger(__name__)

#: Interpreter for remote.pyz on this machine (the agent needs only the standard library).
LOCAL_PYTHON: list[str] = [sys.executable]
#: Where local agent directories are created (None: the system temporary directory).
LOCAL_ROOT: str | None = None


class LocalEcho(EchoChannel):
    """A child process fed on stdin; ``label`` names where it runs in messages (the exec
    transport's channels are such children too: the prefix's program runs here)."""

    def __init__(self, argv: list[str], label: str = "local"):
        self.label = label
        try:
            # its own session: a Ctrl-C at the controller's terminal is the controller's to handle
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, bufsize=0, start_new_session=True)
        except OSError as e:
            raise AgentError(f"{label}: cannot start {argv[0]}: {e.strerror or e}") from None
        if self.proc.stdin is None or self.proc.stdout is None:  # Popen makes both with PIPE
            raise AgentError(f"{label}: {argv[0]} started without pipes")
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self._buf = b""

    def send(self, line: bytes) -> None:
        try:
            self.stdin.write(line)
        except OSError as e:
            raise TransportError(f"{self.label}: echo process gone ({e.strerror or e})") from None

    def recv_line(self, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        fd = self.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TransportError(f"{self.label}: echo process silent for {timeout:g}s")
            chunk = os.read(fd, 4096)
            if not chunk:
                raise TransportError(f"{self.label}: echo process exited")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def closed_within(self, timeout: float) -> bool:
        fd = self.stdout.fileno()
        if not select.select([fd], [], [], max(0.0, timeout))[0]:
            return False
        chunk = os.read(fd, 4096)
        self._buf += chunk
        return not chunk

    def close(self) -> None:
        try:
            self.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=3)
        self.stdout.close()


class LocalTransport(Transport):
    kind = "local"
    transfer = "local"

    def __init__(self, label: str = "local", python: list[str] | None = None):
        self.label = label
        self.python = list(python or LOCAL_PYTHON)

    def run_root(self, run_id: str, label: str) -> str:
        return tempfile.mkdtemp(prefix=f"kneeswarm-{run_id}-{label}-", dir=LOCAL_ROOT)

    def run(self, argv: list[str], timeout: float, stdin: bytes | None = None) -> CommandResult:
        try:
            p = subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout,
                               stdin=None if stdin is not None else subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise TransportError(f"local: {' '.join(argv[:3])} ... did not finish in {timeout:g}s") from None
        except OSError as e:
            return CommandResult(127, b"", f"{argv[0]}: {e.strerror or e}".encode())
        return CommandResult(p.returncode, p.stdout, p.stderr)

    def makedirs(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)

    def put(self, path: str, data: bytes, mode: int = 0o644) -> None:
        tmp = f"{path}.tmp-upload"
        Path(tmp).write_bytes(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)

    def sizes(self, path: str) -> dict[str, int]:
        try:
            return {e.name: e.stat().st_size for e in os.scandir(path) if e.is_file(follow_symlinks=False)}
        except FileNotFoundError:
            raise AgentError(f"local: agent directory {path} is gone") from None

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(length)

    def remove_tree(self, path: str) -> None:
        """Remove an agent directory; AgentError (one line) when any of it stays (one already
        gone is removed)."""
        if not os.path.lexists(path):
            return
        errors: list[str] = []

        def failed(_func: Any, where: str, exc: Any) -> None:  # exc: the exception (onexc) or exc_info (onerror)
            e = exc[1] if isinstance(exc, tuple) else exc
            errors.append(f"{where}: {getattr(e, 'strerror', None) or e}")

        if sys.version_info >= (3, 12):
            shutil.rmtree(path, onexc=failed)
        else:
            shutil.rmtree(path, onerror=failed)
        if errors:
            raise AgentError(f"{self.label}: removal of {path} failed: {errors[0]}"
                             + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""))

    def open_echo(self, argv: list[str]) -> EchoChannel:
        return LocalEcho(argv)

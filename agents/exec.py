"""The ``exec`` transport: the agent reached through any command that runs a program where the
server runs, with its stdin and stdout (no sshd, no SFTP).

    ExecTransport(["kubectl", "exec", "-i", "-n", "serving", "pod/triton-0", "-c", "server", "--"], "triton-0")
    ExecTransport(["docker", "exec", "-i", "triton"], "triton")
    ExecTransport(["nsenter", "-t", "4242", "-a"], "srv")

Every command of the agent's lifecycle is ``PREFIX + argv`` run here as a child process (argv is
passed as separate words: kubectl, docker, podman and nsenter all exec it without a shell, so no
quoting is involved).  Files move through the command channel (kneeswarm.agents.fileops: the
upload checked by sha256), the clock and the watch channel are long-lived children fed on stdin
(kneeswarm.agents.local.LocalEcho): when the controller dies, the prefix's stdin closes, the exec'd
``watch`` reads EOF and the agent stops, as over SSH.

Paths: the agent directory is absolute (EXEC_ROOT), since an exec'd command starts in whatever
working directory the container sets.  Opening the transport runs ``sh -c 'echo ...'`` once, so
that a prefix that cannot reach the container (no such pod, kubectl missing) and a container
without a shell are one line each here, not a wrong guess later (a failing python3 probe would
otherwise read as "no python3": the shell agent).
"""

from __future__ import annotations

import logging
import posixpath
import re
import shlex
import subprocess
import time

from kneeswarm.agents.errors import AgentError, TransportError
from kneeswarm.agents.fileops import exec_op, exec_put, exec_sizes
from kneeswarm.agents.local import LocalEcho
from kneeswarm.agents.transport import CommandResult, EchoChannel, Transport

logger = logging.getLogger(__name__)

#: Where agent directories go in the container: absolute (an exec'd command's working directory
#: is the image's), under /tmp (writable in most images; a read-only root file system usually
#: mounts an emptyDir there).
EXEC_ROOT = "/tmp/.kneeswarm/runs"
CONNECT_TIMEOUT = 60.0  # seconds for the first command through the prefix (kubectl: API server + exec)
#: What the opening check prints: a container that answers it has a POSIX shell.
HELLO = "kneeswarm-exec-ok"
#: The way out where the container has no shell, or neither python3 nor a collector's tool.
WAY_OUT = ("monitor it from a debug container that shares its process namespace: "
           "kubernetes = {..., debug_image = \"python:3.12-slim\"} (kubectl debug --target), "
           "or an exec prefix into such a container")


class ExecTransport(Transport):
    kind = "exec"
    transfer = "exec"

    def __init__(self, prefix: list[str], label: str, python: list[str] | None = None, connect: bool = True):
        if not prefix:
            raise AgentError(f"{label}: the exec prefix is empty")
        self.prefix = list(prefix)
        self.label = label
        self.python = list(python or ["python3"])
        self.way_out = WAY_OUT
        if connect:
            self.connect()

    # -- the connection ---------------------------------------------------------------------
    def connect(self) -> None:
        """One ``sh -c 'echo HELLO'`` through the prefix; AgentError (one line) when the prefix
        cannot run it: its program missing, the container not reached, or no shell in it."""
        res = self.run(["sh", "-c", f"echo {HELLO}"], CONNECT_TIMEOUT)
        if HELLO.encode() in res.stdout:
            return
        line = res.err_line()
        if _no_shell(line):
            raise AgentError(f"{self.label}: the container has no shell (sh: {line}); {WAY_OUT}")
        raise TransportError(f"{self.label}: {shlex.join(self.prefix[:6])} ... failed: {line}")

    def reconnect(self) -> None:
        self.connect()

    # -- Transport --------------------------------------------------------------------------
    def run_root(self, run_id: str, label: str) -> str:
        return f"{EXEC_ROOT}/{run_id}/{label}"

    def run(self, argv: list[str], timeout: float, stdin: bytes | None = None) -> CommandResult:
        """``PREFIX + argv`` to completion within ``timeout``; AgentError where the prefix's program
        cannot be started here."""
        cmd = [*self.prefix, *argv]
        started = time.monotonic()
        try:
            p = subprocess.run(cmd, input=stdin, capture_output=True, timeout=timeout,
                               stdin=None if stdin is not None else subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise TransportError(f"{self.label}: {shlex.join(argv[:3])} ... through {self.prefix[0]} did not "
                                 f"finish in {timeout:g}s") from None
        except OSError as e:  # the prefix's own program: kubectl, docker, nsenter not installed here
            raise AgentError(f"{self.label}: cannot run the exec prefix's {self.prefix[0]}: {e.strerror or e}") from None
        logger.debug("%s: %s (%.2fs, rc %d)", self.label, shlex.join(argv[:2]), time.monotonic() - started,
                     p.returncode)
        return CommandResult(p.returncode, p.stdout, p.stderr)

    def makedirs(self, path: str) -> None:
        exec_op(self, "mkdir", path)

    def put(self, path: str, data: bytes, mode: int = 0o644) -> None:
        exec_put(self, path, data, mode)

    def sizes(self, path: str) -> dict[str, int]:
        return exec_sizes(self, path)

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        return exec_op(self, "read", path, str(offset), str(length))

    def remove_tree(self, path: str) -> None:
        """Remove an agent directory (only one under EXEC_ROOT), then the run's when empty."""
        norm = posixpath.normpath(path)
        if ".." in norm.split("/") or not norm.startswith(EXEC_ROOT + "/"):
            raise AgentError(f"{self.label}: refusing to remove {path!r} (not an agent directory)")
        res = self.run(["rm", "-rf", "--", norm], timeout=60)
        if res.rc != 0:
            raise AgentError(f"{self.label}: rm -rf {norm} failed: {res.err_line()}")
        self.run(["rmdir", "--", posixpath.dirname(norm)], timeout=30)

    def open_echo(self, argv: list[str]) -> EchoChannel:
        return LocalEcho([*self.prefix, *argv], label=self.label)

    def describe(self) -> str:
        return f"exec:{shlex.join(self.prefix)}"


def _no_shell(line: str) -> bool:
    """Whether a failed ``sh -c`` says the container has no sh, in the words of the runtimes
    (OCI: 'exec: "sh": executable file not found in $PATH'; nsenter and env: 'sh: No such file')."""
    low = line.lower()
    return bool(re.search(r"\bsh\b", low)) and any(w in low for w in ("not found", "no such file"))

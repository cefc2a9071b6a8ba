"""One host's transport with the agent directory on it: retries, reconnects, ``remote.pyz`` calls.

Every piece of a host agent (deploy, heartbeat, fetch) goes through one ``HostLink``, so a lost
connection is retried, and the transport replaced, in one place.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Callable, TypeVar

from kneeswarm.agents.errors import AgentError, HostKeyError, TransportError
from kneeswarm.agents.shellagent import PYTHON_AGENT, AgentFlavor
from kneeswarm.agents.transport import EchoChannel, Transport

logger = logging.getLogger(__name__)

RECONNECT_BACKOFF = (0.5, 1.0, 2.0, 4.0, 8.0)  # seconds between reconnect attempts (last repeats)
RECONNECT_WINDOW = 10.0  # seconds an operation during the run keeps retrying before giving up
#: Prefixes of the remote command lines (tests run the agent under faketime with these).
AGENT_WRAPPER: list[str] = []
ECHO_WRAPPER: list[str] = []

T = TypeVar("T")


def backoff(attempt: int) -> float:
    """Seconds to wait before reconnect attempt ``attempt`` (0-based)."""
    return RECONNECT_BACKOFF[min(attempt, len(RECONNECT_BACKOFF) - 1)]


class HostLink:
    def __init__(self, label: str, transport: Transport, run_id: str):
        self.label = label
        self.t = transport
        self.run_id = run_id
        self.remote_dir: str | None = None
        #: remote.pyz, or remote.sh where the host's python3 is absent or too old (kneeswarm.agents.shellagent)
        self.flavor: AgentFlavor = PYTHON_AGENT
        self.lock = threading.RLock()
        self.reconnects = 0
        #: Called after every successful reconnect (the heartbeat reopens its channel at once).
        self.on_reconnect: list[Callable[[], None]] = []

    def path(self, name: str) -> str:
        assert self.remote_dir is not None
        return f"{self.remote_dir}/{name}"

    def argv(self, *args: str, wrapper: list[str] | None = None) -> list[str]:
        """The command line of ``remote.pyz ARGS`` (or ``sh remote.sh ARGS``) on the host (AGENT_WRAPPER
        unless ``wrapper``)."""
        return [*(AGENT_WRAPPER if wrapper is None else wrapper), *self.flavor.interpreter(self.t),
                self.path(self.flavor.script), *args]

    def bare(self, e: BaseException) -> str:
        """The message of e without a leading '<label>: ' (messages name the host once)."""
        text = str(e) or type(e).__name__
        return text[len(self.label) + 2 :] if text.startswith(f"{self.label}: ") else text

    def reconnect(self) -> bool:
        """Replace the connection once; False (logged) if the host cannot be reached now."""
        try:
            with self.lock:
                self.t.reconnect()
                self.reconnects += 1
            for hook in self.on_reconnect:
                hook()
            return True
        except HostKeyError:
            raise
        except (AgentError, OSError, EOFError) as e:
            logger.warning("%s: reconnect failed: %s", self.label, self.bare(e))
            return False

    def retry(self, op: Callable[[], T], window: float, what: str) -> T:
        """Run op; on a lost connection reconnect with backoff for up to ``window`` seconds."""
        deadline = time.monotonic() + window
        attempt = 0
        while True:
            try:
                with self.lock:
                    return op()
            except HostKeyError:
                raise
            except (TransportError, OSError, EOFError) as e:
                if time.monotonic() >= deadline:
                    raise TransportError(f"{self.label}: {what} failed: {self.bare(e)}") from None
                pause = backoff(attempt)
                logger.warning("%s: %s failed (%s); reconnecting in %.1fs", self.label, what, self.bare(e), pause)
                time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
                attempt += 1
                self.reconnect()

    def put(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self.retry(lambda: self.t.put(self.path(name), data, mode), RECONNECT_WINDOW, f"upload of {name}")

    def open_channel(self, *args: str, wrapper: list[str] | None = None) -> EchoChannel:
        with self.lock:
            return self.t.open_echo(self.argv(*args, wrapper=wrapper))

    def open_echo(self) -> EchoChannel:
        """A ``remote.pyz echo`` process for the clock (ECHO_WRAPPER, read at call time)."""
        return self.open_channel("echo", wrapper=ECHO_WRAPPER)

    def call(self, verb: str, arg: str | None, timeout: float, window: float = RECONNECT_WINDOW,
             wrapper: list[str] | None = None) -> dict[str, Any]:
        """Run ``remote.pyz VERB [ARG]`` and return the JSON object it printed; AgentError otherwise."""
        argv = self.argv(verb, *([arg] if arg else []), wrapper=wrapper)
        res = self.retry(lambda: self.t.run(argv, timeout), window, f"{self.flavor.script} {verb}")
        text = res.stdout.decode("utf-8", "replace").strip()
        if res.rc == 127 or (res.rc != 0 and not text):
            line = res.err_line()
            if "python3" in line and ("not found" in line or "No such file" in line):
                raise AgentError(f"{self.label}: python3 is not installed on the host ({line})")
            raise AgentError(f"{self.label}: {self.flavor.script} {verb} failed: {line}")
        try:
            out = json.loads(text.splitlines()[-1])
        except (ValueError, IndexError):
            raise AgentError(f"{self.label}: {self.flavor.script} {verb} printed no JSON ({res.err_line()})") from None
        if not isinstance(out, dict):
            raise AgentError(f"{self.label}: {self.flavor.script} {verb} printed {text[:80]!r}")
        if out.get("ok") is False:
            raise AgentError(f"{self.label}: {self.flavor.script} {verb}: {out.get('error')}")
        return out

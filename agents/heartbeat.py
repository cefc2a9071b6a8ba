"""The controller's heartbeat: one line every HEARTBEAT_PERIOD seconds on a ``remote.pyz watch``
channel, in a thread, reconnecting when the line is not answered.

The watch process renews the agent's heartbeat file on each line. When the controller dies the
channel closes and the agent stops a few seconds later (remote.pyz ``WATCH_EOF_GRACE``); when the
network goes away the heartbeat timeout stops it, unless this thread reconnects first.
"""

from __future__ import annotations

import logging
import threading
import time

from kneeswarm.contracts.rundir import WarningLog

from kneeswarm.agents.errors import AgentError
from kneeswarm.agents.link import HostLink, backoff
from kneeswarm.agents.remote.defaults import WATCH_BYE
from kneeswarm.agents.transport import EchoChannel

logger = logging.getLogger(__name__)

HEARTBEAT_PERIOD = 3.0  # seconds between heartbeats (at most a third of the heartbeat timeout)
WATCH_REPLY_TIMEOUT = 10.0  # seconds to wait for the watch process's "ok"
JOIN_TIMEOUT = 15.0  # seconds ``stop`` waits for the thread
PAUSE_SLICE = 0.25  # seconds between checks of the stop flag while waiting for the next beat


class Heartbeat:
    def __init__(self, link: HostLink, timeout: float, warnings: WarningLog):
        self.link = link
        self.timeout = float(timeout)
        self.warnings = warnings
        self.failures = 0
        self._chan: EchoChannel | None = None
        self._chan_link = -1  # link.reconnects when the channel was opened
        self._stop = threading.Event()
        self._wake = threading.Event()  # a reconnect by anyone: beat now, on a new channel
        self._thread: threading.Thread | None = None
        link.on_reconnect.append(self._wake.set)

    def start(self) -> None:
        """Open the watch channel (AgentError if it cannot be) and start the thread."""
        if not self.beat():
            raise AgentError(f"{self.link.label}: the watch channel (heartbeat) did not answer")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{self.link.label}", daemon=True)
        self._thread.start()

    def beat(self) -> bool:
        """One heartbeat (opening the channel if needed); False if it was not answered."""
        if self._chan is not None and self._chan_link != self.link.reconnects:
            self._close(bye=False)  # its connection was replaced: the old watch saw EOF, renew in time
        try:
            if self._chan is None:
                self._chan_link = self.link.reconnects
                self._chan = self.link.open_channel("watch", self.link.remote_dir or "")
            self._chan.send(b"beat\n")
            answer = self._chan.recv_line(WATCH_REPLY_TIMEOUT)
            if answer.strip() != b"ok":
                raise AgentError(f"{self.link.label}: the watch channel answered {answer[:40]!r}")
            return True
        except (AgentError, OSError, EOFError) as e:
            logger.warning("%s: heartbeat failed: %s", self.link.label, self.link.bare(e))
            self.failures += 1
            if self.failures == 1:
                self.warnings.add(f"connection lost during the run at {time.time():.0f} ({self.link.bare(e)}); "
                                  "the agent kept recording, the controller reconnected")
            self._close(bye=True)
            return False

    def _pause(self, seconds: float) -> None:
        """Wait ``seconds``, less when stopped, woken, or when the channel closes: a dead
        connection is replaced at once, well within the watch's EOF grace on the host."""
        deadline = time.monotonic() + seconds
        while not (self._stop.is_set() or self._wake.is_set()):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            chan = self._chan
            if chan is None:
                self._wake.wait(min(PAUSE_SLICE, left))
            elif chan.closed_within(min(PAUSE_SLICE, left)):
                logger.info("%s: the watch channel closed; renewing it now", self.link.label)
                return

    def _loop(self) -> None:
        period = min(HEARTBEAT_PERIOD, self.timeout / 3.0)
        attempt = 0
        while True:
            self._pause(period if attempt == 0 else backoff(attempt - 1))
            self._wake.clear()
            if self._stop.is_set():
                return
            if self.beat():
                attempt = 0
                continue
            attempt += 1
            if self.link.reconnect():
                self._wake.clear()  # our own reconnect: the backoff still applies
                logger.info("%s: reconnected", self.link.label)

    def _close(self, bye: bool) -> None:
        chan, self._chan = self._chan, None
        if chan is None:
            return
        try:
            if bye:  # a clean goodbye: the watch process ends without stopping the agent
                chan.send(WATCH_BYE + b"\n")
            chan.close()
        except Exception as e:  # a dead channel: the remote side sees no EOF, or one long after
            logger.debug("%s: closing the watch channel: %s", self.link.label, e)

    def stop(self) -> None:
        """Stop the thread and say goodbye on the channel (the agent keeps running)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=JOIN_TIMEOUT)
            self._thread = None
        self._close(bye=True)

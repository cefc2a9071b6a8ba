"""Locust workers started over SSH on load machines (`kneeswarm run --worker-hosts ...`), floor 4.

    --worker-hosts user@a,user@b:2222/4      user@host[:ssh port][/worker processes] (default 1)

Each host is reached with the agents' paramiko layer and host-key rules (known_hosts; a new key
recorded only with --accept-new-host-keys; a changed key always refused).  Before any load, each
host's `kneeswarm worker --versions` must match this machine's kneeswarm and Locust versions (one
line, exit 2, no run directory, if not).  Workers are started detached in their own session
(`nohup setsid ... &`), and at the end their process group is sent SIGTERM, then SIGKILL, and
checked gone: nothing is left running.  Workers reach the master on --master-bind-host; the
channel is unauthenticated, so that address must be on a private network.
"""

from __future__ import annotations

import json
import logging
import shlex
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

SSH_TIMEOUT = 30.0  # seconds for one remote command
STOP_GRACE = 10.0  # seconds a worker group has after SIGTERM before SIGKILL
VERSION_KEYS = ("kneeswarm", "locust")


class WorkerHostsError(ValueError):
    """Bad --worker-hosts input, or a host that cannot run workers; str() is one line."""


@dataclass
class WorkerHost:
    ssh: str  # user@host[:port]
    processes: int = 1
    pid: int | None = None  # the started worker's process group, on that host

    @property
    def label(self) -> str:
        return self.ssh.split("@")[-1]


def parse_worker_hosts(text: str) -> list[WorkerHost]:
    """'user@a,user@b:2222/4' -> hosts; WorkerHostsError naming the bad entry."""
    out = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        ssh, _, procs = item.partition("/")
        if "@" not in ssh or not procs.isdigit() and procs:
            raise WorkerHostsError(f"--worker-hosts {item!r}: expected user@host[:port][/processes]")
        n = int(procs or 1)
        if n < 1:
            raise WorkerHostsError(f"--worker-hosts {item!r}: at least one process")
        out.append(WorkerHost(ssh, n))
    if not out:
        raise WorkerHostsError("--worker-hosts: no host given")
    return out


class RemoteWorkers:
    """The workers of one run on their load machines."""

    def __init__(self, hosts: list[WorkerHost], command: str = "kneeswarm", key_file: str | None = None,
                 known_hosts: str | None = None, accept_new_host_keys: bool = False):
        self.hosts, self.command = hosts, command
        self.key_file, self.known_hosts, self.accept_new = key_file, known_hosts, accept_new_host_keys
        self.transports: dict[str, Any] = {}
        self.warnings: list[str] = []

    @property
    def processes(self) -> int:
        return sum(h.processes for h in self.hosts)

    def open(self, expected: dict[str, str]) -> None:
        """Connect to every host and check its versions; WorkerHostsError (all closed) if one fails."""
        from kneeswarm.agents.errors import AgentError
        from kneeswarm.agents.ssh import SSHTransport

        try:
            for h in self.hosts:
                self.transports[h.ssh] = SSHTransport(h.ssh, key_file=self.key_file, known_hosts=self.known_hosts,
                                                      accept_new_host_keys=self.accept_new, label=h.label)
                self._check_versions(h, expected)
        except (AgentError, WorkerHostsError) as e:
            self.close()
            raise WorkerHostsError(str(e)) from None

    def _check_versions(self, h: WorkerHost, expected: dict[str, str]) -> None:
        res = self.transports[h.ssh].run(["sh", "-c", f"{self.command} worker --versions"], timeout=SSH_TIMEOUT)
        try:
            theirs = json.loads(res.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise WorkerHostsError(f"{h.label}: `{self.command} worker --versions` failed: {res.err_line()}") from None
        wrong = [f"{k} {theirs.get(k)} (here {expected.get(k)})" for k in VERSION_KEYS if theirs.get(k) != expected.get(k)]
        if wrong:
            raise WorkerHostsError(f"{h.label}: versions differ from this machine's: {', '.join(wrong)}")

    def start(self, master_host: str, port: int, tag: str) -> None:
        """Start every host's workers, detached; a host that fails is a warning (the master's wait
        for workers then says how many came)."""
        for h in self.hosts:
            log = f"kneeswarm-worker-{tag}.log"
            cmd = (f"nohup setsid {self.command} worker --master {shlex.quote(f'{master_host}:{port}')} "
                   f"--processes {h.processes} >{log} 2>&1 </dev/null & echo $!")
            try:
                res = self.transports[h.ssh].run(["sh", "-c", cmd], timeout=SSH_TIMEOUT)
                h.pid = int(res.stdout.decode().strip().splitlines()[-1])
                logger.info("%s: %d worker processes started (group %d)", h.label, h.processes, h.pid)
            except Exception as e:  # noqa: BLE001 - one host's failure is its own
                self.warnings.append(f"worker host {h.label}: could not start workers: {e}")

    def stop(self) -> None:
        """SIGTERM each worker group, SIGKILL what is left after STOP_GRACE, check it is gone; never raises."""
        for h in self.hosts:
            if h.pid is None:
                continue
            script = (f"kill -TERM -- -{h.pid} 2>/dev/null; i=0; while kill -0 -- -{h.pid} 2>/dev/null && "
                      f"[ $i -lt {int(STOP_GRACE * 10)} ]; do sleep 0.1; i=$((i+1)); done; "
                      f"kill -KILL -- -{h.pid} 2>/dev/null; sleep 0.2; kill -0 -- -{h.pid} 2>/dev/null && echo left "
                      f"|| echo gone")
            try:
                res = self.transports[h.ssh].run(["sh", "-c", script], timeout=SSH_TIMEOUT + STOP_GRACE)
                if b"gone" not in res.stdout:
                    self.warnings.append(f"worker host {h.label}: worker group {h.pid} still running after SIGKILL")
                h.pid = None
            except Exception as e:  # noqa: BLE001 - reported, the other hosts still stopped
                self.warnings.append(f"worker host {h.label}: could not stop workers (group {h.pid}): {e}")
        self.close()

    def close(self) -> None:
        for t in self.transports.values():
            try:
                t.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        self.transports = {}


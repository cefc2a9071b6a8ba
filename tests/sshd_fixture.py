"""A real OpenSSH server on loopback for the agents tests (ephemeral host key and user key), and
process-table helpers (a busy process to monitor, a controller killed, leftover checks).

    from tests.sshd_fixture import sshd, SSHD   # noqa: F401 (the fixture)

``sshd`` is session-scoped; ``SSHD.start(dir)`` starts a private one (e.g. to change its key).
The test is skipped (with the reason) when /usr/sbin/sshd is missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pytest

SSHD_BIN = "/usr/sbin/sshd"
START_TIMEOUT = 10.0
CLIENT_ALIVE_S, CLIENT_ALIVE_COUNT = 5, 4  # sshd drops a silent client after 20 s (> the 10 s link-down test)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path, passphrase: str = "", kind: str = "ed25519") -> Path:
    for p in (path, path.with_name(path.name + ".pub")):
        if p.exists():
            p.unlink()
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", passphrase, "-C", "kneeswarm-test", "-f", str(path)],
                   check=True, stdin=subprocess.DEVNULL, timeout=30)
    return path


def fingerprint_of(pub: Path) -> str:
    """SHA256:... as ssh-keygen -l prints it."""
    out = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(pub)], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    return out.split()[1]


@dataclass
class SSHD:
    dir: Path
    port: int
    listen: str = "127.0.0.1"
    proc: subprocess.Popen | None = None
    netns: str | None = None  # run inside this network namespace (ip netns exec)
    extra_keys: list[Path] = field(default_factory=list)
    forced: dict[Path, str] = field(default_factory=dict)  # authorized_keys command="..." per key

    host_key = property(lambda self: self.dir / "ssh_host_ed25519_key")
    user_key = property(lambda self: self.dir / "id_ed25519")
    authorized_keys = property(lambda self: self.dir / "authorized_keys")
    config = property(lambda self: self.dir / "sshd_config")
    log = property(lambda self: self.dir / "sshd.log")

    @property
    def target(self) -> str:
        return f"root@{self.listen}:{self.port}"

    @property
    def host_key_name(self) -> str:
        return self.listen if self.port == 22 else f"[{self.listen}]:{self.port}"

    def known_hosts_line(self) -> str:
        kind, b64 = self.host_key.with_name(self.host_key.name + ".pub").read_text().split()[:2]
        return f"{self.host_key_name} {kind} {b64}\n"

    def write_known_hosts(self, path: Path) -> Path:
        path.write_text(self.known_hosts_line())
        return path

    def fingerprint(self) -> str:
        return fingerprint_of(self.host_key.with_name(self.host_key.name + ".pub"))

    def authorize(self, key: Path, path: str | None = None) -> None:
        """Let ``key`` log in; ``path``: the PATH its sessions get (a host whose python3 is another,
        or absent), set by a forced command (login_with_path) after root's shell startup files."""
        self.extra_keys.append(key)
        if path is not None:
            self.forced[key] = str(login_with_path(self.dir / f"login-{key.name}", path))
        self._write_authorized()

    def _write_authorized(self) -> None:
        keys = [self.user_key, *self.extra_keys]
        self.authorized_keys.write_text("".join(
            (f'command="{self.forced[k]}" ' if k in self.forced else "") + k.with_name(k.name + ".pub").read_text()
            for k in keys))

    @classmethod
    def start(cls, dir: Path, listen: str = "127.0.0.1", port: int | None = None, netns: str | None = None,
              sftp: bool = True) -> SSHD:
        """A private sshd; ``sftp=False`` leaves out the ``Subsystem sftp`` line (exec channel only)."""
        if not os.path.exists(SSHD_BIN):
            pytest.skip(f"{SSHD_BIN} is not installed (apt-get install openssh-server)")
        dir.mkdir(parents=True, exist_ok=True)
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege separation directory
        s = cls(dir=dir, port=port or free_port(), listen=listen, netns=netns)
        keygen(s.host_key)
        keygen(s.user_key)
        s._write_authorized()
        s.config.write_text(
            f"Port {s.port}\nListenAddress {listen}\nHostKey {s.host_key}\nPidFile {dir}/sshd.pid\n"
            f"AuthorizedKeysFile {s.authorized_keys}\nStrictModes no\nUsePAM no\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "PubkeyAuthentication yes\nAllowTcpForwarding yes\n"
            + ("Subsystem sftp internal-sftp\n" if sftp else "")
            + "MaxSessions 64\nMaxStartups 64\nLogLevel ERROR\n"
            # A session whose client vanished without a FIN (a link taken down, a namespace
            # removed) ends after CLIENT_ALIVE_S * CLIENT_ALIVE_COUNT seconds instead of never.
            f"ClientAliveInterval {CLIENT_ALIVE_S}\nClientAliveCountMax {CLIENT_ALIVE_COUNT}\n"
        )
        s.run()
        return s

    def run(self) -> None:
        argv = [SSHD_BIN, "-f", str(self.config), "-D", "-e"]
        if self.netns:
            argv = ["ip", "netns", "exec", self.netns, *argv]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited {self.proc.returncode}: {self.log.read_text()[-500:]}")
            if self._ready():
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"sshd did not listen on {self.listen}:{self.port} within {START_TIMEOUT}s")

    def _ready(self) -> bool:
        if self.netns:
            r = subprocess.run(["ip", "netns", "exec", self.netns, "ss", "-Hltn", f"sport = :{self.port}"],
                               capture_output=True, text=True, timeout=10)
            return str(self.port) in r.stdout
        try:
            with socket.create_connection((self.listen, self.port), timeout=0.5) as c:
                c.settimeout(1.0)
                return c.recv(4).startswith(b"SSH-")
        except OSError:
            return False

    def sessions(self) -> list[int]:
        """PIDs of the per-connection sshd processes (and their children) of this server."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        try:
            import psutil

            return [c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)]
        except Exception:  # psutil missing or the listener just exited
            return []

    def stop(self, sessions: bool = True) -> None:
        """Stop the listener and (``sessions``) every session it still serves: a session whose
        client is gone without a FIN would otherwise outlive the test."""
        left = self.sessions() if sessions else []
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.proc = None
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def restart(self, new_host_key: bool = False) -> None:
        self.stop(sessions=False)  # like a real sshd restart: open sessions carry on
        if new_host_key:
            keygen(self.host_key)
        self.run()


SFTP_SERVER = "/usr/lib/openssh/sftp-server"


def login_with_path(script: Path, path: str) -> Path:
    """A forced command that runs the client's command (or the sftp subsystem, which sshd names
    in SSH_ORIGINAL_COMMAND) under ``path``:
    root's .bashrc here puts pyenv's shims first, so an environment= PATH would not hold."""
    script.write_text(f"""#!/bin/sh
PATH='{path}'; export PATH
case "${{SSH_ORIGINAL_COMMAND:-}}" in ""|internal-sftp|*/sftp-server) exec {SFTP_SERVER} ;; esac
exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"
""")
    script.chmod(0o755)
    return script


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory):
    if shutil.which("ssh-keygen") is None or not os.path.exists(SSHD_BIN):
        pytest.skip(f"{SSHD_BIN} or ssh-keygen is not installed (apt-get install openssh-server)")
    server = SSHD.start(tmp_path_factory.mktemp("sshd"))
    try:
        yield server
    finally:
        server.stop()


# -- process helpers ---------------------------------------------------------------------------
REPO = Path(__file__).resolve().parents[1]

BUSY_THREAD = "spin"  # the kernel's name (comm) of the spinning thread: pidstat -t and /proc show it
BUSY_CODE = f"""
import threading, time
def spin():
    with open(f"/proc/self/task/{{threading.get_native_id()}}/comm", "w") as f:
        f.write("{BUSY_THREAD}")
    while True:
        sum(range(20000))
threading.Thread(target=spin, daemon=True).start()
while True:
    time.sleep(0.01)
"""


def kernel_cpu(pid: int) -> tuple[float, float]:
    """(now, the CPU seconds the kernel has counted for ``pid``: utime + stime of /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return time.time(), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def busy_share(a: tuple[float, float], b: tuple[float, float]) -> float:
    """The % of a core the process got between two kernel_cpu readings."""
    return 100.0 * (b[1] - a[1]) / (b[0] - a[0])


def start_busy() -> subprocess.Popen:
    """A process that keeps about one core busy in a thread (something for pidstat to see)."""
    return subprocess.Popen([sys.executable, "-c", BUSY_CODE], stdin=subprocess.DEVNULL)


def stop_proc(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.kill()
    p.wait(timeout=10)


def start_time(pid: int) -> int | None:
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = data[data.rfind(")") + 2 :].split()
    return None if fields[0] == "Z" else int(fields[19])


def processes_mentioning(text: str) -> list[tuple[int, str]]:
    """(pid, cmdline) of live processes whose command line contains ``text``."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if text in cmd and start_time(int(name)) is not None:
            out.append((int(name), cmd.strip()))
    return out


def collector_pids(status: dict) -> dict[str, tuple[int, int]]:
    return {n: (c["pid"], c["start_time"]) for n, c in (status.get("collectors") or {}).items() if c.get("pid")}


def leftovers(remote_dir: str, pids: dict[str, tuple[int, int]]) -> list[str]:
    """Agent processes (by their directory) and collectors (by pid + start time) still alive."""
    left = [f"{pid} {cmd}" for pid, cmd in processes_mentioning(remote_dir) if "remote.pyz" in cmd]
    left += [f"{name} pid {pid}" for name, (pid, st) in pids.items() if start_time(pid) == st]
    return left


@contextlib.contextmanager
def killed_controller(code: str, gone_within: float, remove: Callable[[str], None]) -> Iterator[tuple[str, list[str]]]:
    """Run ``code`` (a controller: it opens an agent, starts it, prints {"remote_dir", "status"}
    and sleeps) in its own process and SIGKILL it a second into collecting.  Yields (the agent's
    remote_dir, what is still alive ``gone_within`` seconds later: wait_until_gone's list);
    ``remove(remote_dir)`` cleans up on the way out, whatever happened."""
    ctl = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    remote_dir = None
    try:
        assert ctl.stdout is not None
        started = json.loads(ctl.stdout.readline())
        remote_dir, pids = started["remote_dir"], collector_pids(started["status"])
        assert {"pidstat", "vmstat"} <= set(pids)
        time.sleep(1.0)  # the collectors at work
        ctl.send_signal(signal.SIGKILL)
        ctl.wait(timeout=5)
        yield remote_dir, wait_until_gone(remote_dir, pids, gone_within)
    finally:
        if ctl.poll() is None:
            ctl.kill()
            ctl.wait()
        if ctl.stdout is not None:
            ctl.stdout.close()
        if remote_dir:
            remove(remote_dir)


def wait_until_gone(remote_dir: str, pids: dict[str, tuple[int, int]], timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        left = leftovers(remote_dir, pids)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)

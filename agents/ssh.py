"""The SSH transport (paramiko): host keys verified, every operation bounded in time.

Trust: the server's key must be in known_hosts (the plan's ``known_hosts`` or ~/.ssh/known_hosts).
An unknown key is refused with its SHA256 fingerprint and the flag that accepts it;
``accept_new_host_keys`` records a new key once (OpenSSH's StrictHostKeyChecking=accept-new);
a changed key is always refused.  Authentication: the plan's key file (encrypted keys: the
passphrase is read from the environment variable the plan names), else ssh-agent and the
default keys.  No password or passphrase ever goes into argv, logs or the run directory.

Commands read stdout and stderr together (no deadlock on large outputs) against a deadline;
files move by SFTP with a socket timeout, or, where the server has no sftp subsystem, through the
exec channel (``python3 -c`` reading stdin, the written file's sha256 checked: Ansible's piped
transfer; ``sh -c`` with coreutils on a host without python3: kneeswarm.agents.fileops); ``transfer``
says which. ProxyJump opens a direct-tcpip channel on the bastion's
connection.
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import io
import logging
import os
import posixpath
import select
import shlex
import socket
import stat
import time
from pathlib import Path
from typing import Any

import paramiko

from kneeswarm.agents.errors import AgentError, HostKeyError, TransportError
# the exec channel's file operations, shared with the exec transport (EXEC_FILE_OPS: named here too)
from kneeswarm.agents.fileops import EXEC_FILE_OPS, EXEC_FILE_OPS_SH, exec_op, exec_put, exec_sizes  # noqa: F401
from kneeswarm.agents.transport import CommandResult, EchoChannel, Transport

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT = 10.0  # TCP connect
BANNER_TIMEOUT = 15.0  # SSH banner after connect
AUTH_TIMEOUT = 15.0  # authentication
CHANNEL_TIMEOUT = 15.0  # opening a channel (session, sftp, direct-tcpip)
SFTP_TIMEOUT = 10.0  # one SFTP request
KEEPALIVE = 5  # seconds between keepalive packets
EOF_GRACE = 2.0  # seconds to wait for EOF after a command's exit status arrived
RUN_MAX_OUTPUT = 256 << 20  # bytes kept per stream of one command; the rest is read and dropped
REMOTE_ROOT = ".kneeswarm/runs"  # per-run agent directories, relative to the remote home
ACCEPT_FLAG = "--accept-new-host-keys"


def parse_target(text: str, default_user: str | None = None) -> tuple[str, str, int]:
    """'user@host[:port]' (host may be [IPv6]) -> (user, host, port)."""
    user, _, hostport = text.rpartition("@")
    user = user or default_user or getpass.getuser()
    port = 22
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        if rest.startswith(":"):
            port = _port(rest[1:], text)
    elif hostport.count(":") == 1:
        host, p = hostport.split(":")
        port = _port(p, text)
    else:
        host = hostport
    if not host:
        raise AgentError(f"ssh target {text!r}: no host name")
    return user, host, port


def _port(p: str, text: str) -> int:
    try:
        port = int(p)
    except ValueError:
        raise AgentError(f"ssh target {text!r}: port {p!r} is not a number") from None
    if not 0 < port < 65536:
        raise AgentError(f"ssh target {text!r}: port {port} out of range")
    return port


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style fingerprint: SHA256:<base64 without padding>."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


def host_key_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


class KnownHostsPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown keys (printing the fingerprint), or record them once in accept-new mode."""

    def __init__(self, path: Path, accept_new: bool, label: str):
        self.path = path
        self.accept_new = accept_new
        self.label = label
        self.recorded: str | None = None

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        fp = fingerprint(key)
        known = client.get_host_keys().lookup(hostname)
        if known:
            other = ", ".join(f"{t} {fingerprint(k)}" for t, k in known.items())
            raise HostKeyError(
                f"{self.label}: HOST KEY CHANGED for {hostname}: the server offers {key.get_name()} {fp}, "
                f"{self.path} has {other}; refusing to connect (remove the old entry if the change is expected)"
            )
        if not self.accept_new:
            raise HostKeyError(
                f"{self.label}: unknown host key for {hostname}: {key.get_name()} {fp} (not in {self.path}); "
                f"check the fingerprint and re-run with {ACCEPT_FLAG} to record it"
            )
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.recorded = fp
        logger.warning("%s: recorded new host key for %s (%s %s) in %s", self.label, hostname, key.get_name(), fp, self.path)


def _map_error(e: BaseException, label: str, where: str) -> AgentError:
    """One-line AgentError for anything paramiko or the socket layer raised."""
    if isinstance(e, AgentError):
        return e
    if isinstance(e, paramiko.BadHostKeyException):
        return HostKeyError(
            f"{label}: HOST KEY CHANGED for {e.hostname}: the server offers {e.key.get_name()} {fingerprint(e.key)}, "
            f"known_hosts has {fingerprint(e.expected_key)}; refusing to connect (remove the old entry if expected)"
        )
    if isinstance(e, paramiko.PasswordRequiredException):
        return AgentError(f"{label}: the key file is encrypted; set passphrase_env to the name of an environment "
                          f"variable that holds its passphrase")
    if isinstance(e, paramiko.AuthenticationException):
        return AgentError(f"{label}: authentication failed for {where} ({type(e).__name__})")
    if isinstance(e, socket.gaierror):
        return AgentError(f"{label}: cannot resolve {where} ({e.strerror or e})")
    if isinstance(e, paramiko.ssh_exception.NoValidConnectionsError):
        return TransportError(f"{label}: cannot connect to {where}: connection refused")
    if isinstance(e, (socket.timeout, TimeoutError)):
        return TransportError(f"{label}: {where} did not answer in time")
    if isinstance(e, OSError) and e.strerror:
        return TransportError(f"{label}: {where}: {e.strerror}")
    return TransportError(f"{label}: {where}: {type(e).__name__}: {e}".rstrip(": "))


class _NoSftp(AgentError):
    """The server is reachable but has no sftp subsystem (not retried: the exec channel is used)."""


class SSHEcho(EchoChannel):
    def __init__(self, chan: paramiko.Channel, label: str):
        self.chan = chan
        self.label = label
        self._buf = b""

    def send(self, line: bytes) -> None:
        try:
            self.chan.settimeout(SFTP_TIMEOUT)
            self.chan.sendall(line)
        except (OSError, EOFError, paramiko.SSHException) as e:
            raise _map_error(e, self.label, "echo channel") from None

    def recv_line(self, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TransportError(f"{self.label}: echo silent for {timeout:g}s")
            self.chan.settimeout(left)
            try:
                chunk = self.chan.recv(4096)
            except socket.timeout:
                continue
            except (OSError, EOFError, paramiko.SSHException) as e:
                raise _map_error(e, self.label, "echo channel") from None
            if not chunk:
                raise TransportError(f"{self.label}: echo process exited")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def closed_within(self, timeout: float) -> bool:
        if self.chan.closed or self.chan.eof_received:
            return True
        if not select.select([self.chan], [], [], max(0.0, timeout))[0]:
            return False
        try:
            self.chan.settimeout(0.1)
            chunk = self.chan.recv(4096)
        except socket.timeout:
            return False
        except (OSError, EOFError, paramiko.SSHException):
            return True
        self._buf += chunk
        return not chunk

    def close(self) -> None:
        try:
            self.chan.shutdown_write()
        except Exception:
            pass
        self.chan.close()


class SSHTransport(Transport):
    kind = "ssh"

    def __init__(self, target: str, key_file: str | None = None, passphrase_env: str | None = None,
                 jump: str | None = None, known_hosts: str | None = None, accept_new_host_keys: bool = False,
                 label: str | None = None, python: list[str] | None = None, connect: bool = True):
        self.target = target
        self.user, self.host, self.port = parse_target(target)
        self.label = label or self.host
        self.key_file = os.path.expanduser(key_file) if key_file else None
        self.passphrase_env = passphrase_env
        self.jump = jump
        self.known_hosts = Path(os.path.expanduser(known_hosts or "~/.ssh/known_hosts"))
        self.accept_new = accept_new_host_keys
        self.python = list(python or ["python3"])
        self.client: paramiko.SSHClient | None = None
        self.jump_client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self.transfer: str | None = None  # "sftp" or "exec" once the first file operation found out
        self.recorded_keys: list[str] = []
        if self.key_file and not os.path.exists(self.key_file):
            raise AgentError(f"{self.label}: key_file {key_file}: no such file")
        if connect:
            self.connect()

    @classmethod
    def from_plan(cls, host: Any, accept_new_host_keys: bool = False) -> SSHTransport:
        return cls(host.ssh, key_file=host.key_file, passphrase_env=host.passphrase_env, jump=host.jump,
                   known_hosts=host.known_hosts, accept_new_host_keys=accept_new_host_keys, label=host.label,
                   python=[host.python] if host.python else None)

    # -- connection ------------------------------------------------------------------------
    def _passphrase(self) -> str | None:
        if not self.passphrase_env:
            return None
        value = os.environ.get(self.passphrase_env)
        if value is None:
            raise AgentError(f"{self.label}: environment variable {self.passphrase_env} (passphrase_env) is not set")
        return value

    def _client(self, user: str, host: str, port: int, sock: Any = None) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        if self.known_hosts.exists():
            try:
                client.load_host_keys(str(self.known_hosts))
            except (OSError, paramiko.SSHException) as e:
                raise AgentError(f"{self.label}: cannot read {self.known_hosts}: {e}") from None
        policy = KnownHostsPolicy(self.known_hosts, self.accept_new, self.label)
        client.set_missing_host_key_policy(policy)
        where = f"{user}@{host}:{port}"
        try:
            client.connect(
                host, port=port, username=user, key_filename=self.key_file, passphrase=self._passphrase(),
                allow_agent=True, look_for_keys=self.key_file is None, timeout=CONNECT_TIMEOUT,
                banner_timeout=BANNER_TIMEOUT, auth_timeout=AUTH_TIMEOUT, channel_timeout=CHANNEL_TIMEOUT,
                sock=sock,
            )
        except BaseException as e:
            client.close()
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            raise _map_error(e, self.label, where) from None
        if policy.recorded:
            self.recorded_keys.append(policy.recorded)
        tr = client.get_transport()
        if tr is not None:
            tr.set_keepalive(KEEPALIVE)
        return client

    def connect(self) -> None:
        self.close()
        sock = None
        if self.jump:
            juser, jhost, jport = parse_target(self.jump, default_user=self.user)
            self.jump_client = self._client(juser, jhost, jport)
            try:
                sock = self.jump_client.get_transport().open_channel(  # type: ignore[union-attr]
                    "direct-tcpip", (self.host, self.port), ("127.0.0.1", 0), timeout=CHANNEL_TIMEOUT)
            except (OSError, EOFError, paramiko.SSHException) as e:
                self.close()
                raise _map_error(e, self.label, f"{self.host}:{self.port} through {self.jump}") from None
        try:
            self.client = self._client(self.user, self.host, self.port, sock=sock)
        except AgentError:
            self.close()
            raise
        logger.info("%s: connected to %s@%s:%d%s", self.label, self.user, self.host, self.port,
                    f" through {self.jump}" if self.jump else "")

    def reconnect(self) -> None:
        self.connect()

    def close(self) -> None:
        for obj in (self._sftp, self.client, self.jump_client):
            if obj is not None:
                try:
                    obj.close()
                except Exception:
                    pass
        self._sftp = self.client = self.jump_client = None

    def _transport(self) -> paramiko.Transport:
        tr = self.client.get_transport() if self.client else None
        if tr is None or not tr.is_active():
            raise TransportError(f"{self.label}: not connected")
        return tr

    def sftp(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            tr = self._transport()
            try:
                self._sftp = paramiko.SFTPClient.from_transport(tr, window_size=None)
            except paramiko.SSHException as e:
                if tr.is_active() and self.transfer is None:  # connected, but no sftp subsystem
                    raise _NoSftp(f"{self.label}: the server has no sftp subsystem ({e})") from None
                raise _map_error(e, self.label, "sftp") from None
            except (OSError, EOFError) as e:
                raise _map_error(e, self.label, "sftp") from None
            if self._sftp is None:
                raise TransportError(f"{self.label}: the server refused the SFTP subsystem")
            self._sftp.get_channel().settimeout(SFTP_TIMEOUT)
            self.transfer = "sftp"
        return self._sftp

    def _use_exec(self) -> bool:
        """True where file operations go through the exec channel (found out once)."""
        if self.transfer is None:
            try:
                self.sftp()
            except _NoSftp:
                self.transfer = "exec"
                logger.warning("%s: the server has no sftp subsystem; files go through the exec channel", self.label)
        return self.transfer == "exec"

    def _exec_op(self, op: str, path: str, *args: str, stdin: bytes | None = None) -> bytes:
        return exec_op(self, op, path, *args, stdin=stdin)

    def _sftp_op(self, what: str, fn: Any) -> Any:
        try:
            return fn(self.sftp())
        except FileNotFoundError:
            raise
        except PermissionError as e:
            raise AgentError(f"{self.label}: {what}: permission denied ({e})") from None
        except (OSError, EOFError, paramiko.SSHException) as e:
            self._sftp = None
            raise _map_error(e, self.label, what) from None

    # -- Transport ---------------------------------------------------------------------------
    def run_root(self, run_id: str, label: str) -> str:
        return f"{REMOTE_ROOT}/{run_id}/{label}"

    def run(self, argv: list[str] | str, timeout: float, stdin: bytes | None = None) -> CommandResult:
        cmd = argv if isinstance(argv, str) else shlex.join(argv)
        try:
            chan = self._transport().open_session(timeout=CHANNEL_TIMEOUT)
        except (OSError, EOFError, paramiko.SSHException) as e:
            raise _map_error(e, self.label, "opening a session") from None
        deadline = time.monotonic() + timeout
        out, err = bytearray(), bytearray()
        try:
            chan.settimeout(max(0.1, timeout))
            chan.exec_command(cmd)
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
            exited_at = None
            while True:
                busy = False
                while chan.recv_ready():
                    data = chan.recv(1 << 16)
                    busy = busy or bool(data)
                    if len(out) < RUN_MAX_OUTPUT:
                        out += data
                    if not data:
                        break
                while chan.recv_stderr_ready():
                    data = chan.recv_stderr(1 << 16)
                    busy = busy or bool(data)
                    if len(err) < RUN_MAX_OUTPUT:
                        err += data
                    if not data:
                        break
                if chan.exit_status_ready():
                    exited_at = exited_at or time.monotonic()
                    drained = not chan.recv_ready() and not chan.recv_stderr_ready()
                    if drained and (chan.eof_received or chan.closed or time.monotonic() - exited_at > EOF_GRACE):
                        break
                if time.monotonic() > deadline:
                    raise TransportError(f"{self.label}: {cmd[:80]!r} did not finish in {timeout:g}s")
                if not busy:
                    select.select([chan], [], [], 0.05)
            rc = chan.recv_exit_status()  # ready: exit_status_ready() was true
        except (OSError, EOFError, paramiko.SSHException) as e:
            raise _map_error(e, self.label, f"running {cmd[:60]!r}") from None
        finally:
            chan.close()
        return CommandResult(rc, bytes(out), bytes(err))

    def makedirs(self, path: str) -> None:
        if self._use_exec():
            self._exec_op("mkdir", path)
            return

        def mk(sftp: paramiko.SFTPClient) -> None:
            parts = [p for p in path.split("/") if p]
            cur = "/" if path.startswith("/") else ""
            for p in parts:
                cur = posixpath.join(cur, p) if cur else p
                try:
                    sftp.stat(cur)
                except FileNotFoundError:
                    sftp.mkdir(cur, mode=0o700)

        self._sftp_op(f"mkdir {path}", mk)

    def put(self, path: str, data: bytes, mode: int = 0o644) -> None:
        if self._use_exec():
            exec_put(self, path, data, mode)
            return

        def up(sftp: paramiko.SFTPClient) -> None:
            tmp = f"{path}.tmp-upload"
            sftp.putfo(io.BytesIO(data), tmp, file_size=len(data), confirm=True)
            sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, path)

        self._sftp_op(f"upload of {path}", up)

    def sizes(self, path: str) -> dict[str, int]:
        if self._use_exec():
            return exec_sizes(self, path)
        try:
            attrs = self._sftp_op(f"listing {path}", lambda s: s.listdir_attr(path))
        except FileNotFoundError:
            raise AgentError(f"{self.label}: agent directory {path} is gone") from None
        return {a.filename: int(a.st_size or 0) for a in attrs if a.st_mode is not None and stat.S_ISREG(a.st_mode)}

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        if self._use_exec():
            return self._exec_op("read", path, str(offset), str(length))

        def rd(sftp: paramiko.SFTPClient) -> bytes:
            with sftp.open(path, "rb") as f:
                f.seek(offset)
                if length > 1 << 16:
                    f.prefetch(offset + length)
                return f.read(length)

        return self._sftp_op(f"read of {path}", rd)

    def remove_tree(self, path: str) -> None:
        norm = posixpath.normpath(path)
        if ".." in norm.split("/") or not (norm.startswith(REMOTE_ROOT + "/") or f"/{REMOTE_ROOT}/" in norm):
            raise AgentError(f"{self.label}: refusing to remove {path!r} (not an agent directory)")
        res = self.run(["rm", "-rf", "--", norm], timeout=60)
        if res.rc != 0:
            raise AgentError(f"{self.label}: rm -rf {norm} failed: {res.err_line()}")
        parent = posixpath.dirname(norm)  # the run's directory, removed when empty
        self.run(["rmdir", "--", parent], timeout=30)

    def open_echo(self, argv: list[str]) -> EchoChannel:
        try:
            chan = self._transport().open_session(timeout=CHANNEL_TIMEOUT)
            chan.exec_command(shlex.join(argv))
        except (OSError, EOFError, paramiko.SSHException) as e:
            raise _map_error(e, self.label, "starting the echo process") from None
        return SSHEcho(chan, self.label)

    def describe(self) -> str:
        return f"ssh:{self.user}@{self.host}:{self.port}" + (f" via {self.jump}" if self.jump else "")

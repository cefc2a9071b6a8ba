"""Containers without a container engine: namespaces made by the test with unshare and entered with
nsenter, for the exec transport's tests (tests/test_exec_transport.py, tests/test_exec_run.py).

A ``Container`` is what a runtime makes of an image: its own PID, mount, UTS and IPC namespaces,
a network namespace with a veth pair to this machine (an address the load reaches), a v1 cpu
cgroup with a quota (half a CPU), and a root file system of its own entered by ``pivot_root``
(the machine's file system is unmounted from it): busybox in /bin and the shared libraries, with
``python3`` on its PATH only when asked.  The server inside is the demo target, run by the
interpreter of this test process bound read-only at the same path (as an image carries its
server's own runtime: it is not on PATH, so the agent's ``python3`` is not found in a busybox
container).  No sshd, no pidstat, no vmstat in either.

A ``DebugContainer`` is what ``kubectl debug --target`` makes: a process in the container's PID
and network namespaces with a mount namespace of its own (this machine's userland: python3,
pidstat, vmstat) and a /proc of the container's PID namespace.

Everything is removed at teardown: PID 1 of each PID namespace killed (the kernel kills the rest),
the network namespace and the cgroup deleted.  Skipped where namespaces cannot be made (not root,
no unshare/nsenter/busybox/iproute2, no cgroup v1 cpu controller).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
CPU_CGROUP = Path("/sys/fs/cgroup/cpu")
ACCT_CGROUP = Path("/sys/fs/cgroup/cpuacct")  # the cgroup's CPU seconds (cpuacct.usage) where v1 splits it off
QUOTA_US, PERIOD_US = 50000, 100000  # half a CPU: the truth the cgroup sampler must read back
START_TIMEOUT = 60.0  # seconds for the container's server to answer
BUSYBOX_PATH = "/bin"
PYTHON_PATH = "/usr/local/bin:/bin"

#: PID 1 of the container: its server in the background, reaped by the shell's wait (a shell as
#: PID 1 also reaps the orphans an exec'd daemon leaves, as tini or an image's shell entry does).
INIT = r"""set -e
R=$1; shift
mount --bind "$R" "$R"
mount -t proc proc "$R/proc"
mount --rbind /sys "$R/sys"
mount --rbind /dev "$R/dev"
# ip netns exec mounted a sysfs of its own: the cgroup v1 hierarchies are mounted again, as a runtime does
mount -t tmpfs -o mode=755 cgroup "$R/sys/fs/cgroup"
for c in $CGROUPS; do mkdir -p "$R/sys/fs/cgroup/$c"; mount -t cgroup -o "$c" cgroup "$R/sys/fs/cgroup/$c"; done
for d in $BINDS; do
  mkdir -p "$R$d"; mount --bind "$d" "$R$d"; mount -o remount,bind,ro "$R$d"
done
cd "$R"
pivot_root . .oldroot
exec /bin/sh -c 'umount -l /.oldroot && rmdir /.oldroot; "$@" & wait' sh "$@"
"""


def skip_without_namespaces() -> None:
    missing = [t for t in ("unshare", "nsenter", "busybox", "ip") if shutil.which(t) is None]
    if os.geteuid() != 0 or missing:
        pytest.skip(f"needs root and {', '.join(missing) or 'namespaces'} (util-linux, busybox, iproute2)")
    if not (CPU_CGROUP / "cgroup.procs").exists():
        pytest.skip(f"no cgroup v1 cpu controller at {CPU_CGROUP}")


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=check)


def make_rootfs(root: Path, python: bool) -> None:
    """busybox and its applets in /bin, the machine's /usr/lib bound at start (shared libraries),
    /usr/local/bin/python3 only where ``python``."""
    for d in ("bin", "proc", "sys", "dev", "tmp", "etc", "usr/lib", "usr/lib64", ".oldroot"):
        (root / d).mkdir(parents=True, exist_ok=True)
    os.chmod(root / "tmp", 0o1777)
    busybox = shutil.which("busybox")
    assert busybox is not None
    shutil.copy2(busybox, root / "bin" / "busybox")
    for applet in _run(busybox, "--list").stdout.split():
        if applet != "busybox":
            (root / "bin" / applet).symlink_to("busybox")
    (root / "lib").symlink_to("usr/lib")
    (root / "lib64").symlink_to("usr/lib64")
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    if python:
        (root / "usr" / "local" / "bin").mkdir(parents=True)
        (root / "usr" / "local" / "bin" / "python3").symlink_to(Path(sys.base_prefix) / "bin" / "python3")


@dataclass
class Container:
    """A running "container"; ``pid`` is its PID 1 as this machine sees it."""

    name: str
    root: Path
    ip: str
    port: int
    path: str  # PATH inside (the exec prefix passes it: nsenter keeps the caller's environment)
    netns: str
    veth: str
    cgroup: Path
    proc: subprocess.Popen | None = None
    pid: int = 0
    debug: list[DebugContainer] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.ip}:{self.port}"

    def prefix(self) -> list[str]:
        """The exec prefix into it: every namespace of its PID 1, the container's environment."""
        return ["nsenter", "-t", str(self.pid), "-a", "env", "-i", f"PATH={self.path}", "HOME=/root"]

    def pid_ns(self) -> str:
        return os.readlink(f"/proc/{self.pid}/ns/pid")

    def processes(self) -> list[tuple[int, str]]:
        """(host pid, command line) of every live process in the container's PID namespace, by the
        kernel's own namespace links (zombies left out: they run nothing)."""
        ns, out = self.pid_ns(), []
        for p in psutil.process_iter(["pid"]):
            try:
                if os.readlink(f"/proc/{p.pid}/ns/pid") == ns and p.status() != psutil.STATUS_ZOMBIE:
                    out.append((p.pid, " ".join(p.cmdline())))
            except (OSError, psutil.Error):
                continue
        return out

    def server_pid(self) -> int:
        """The server's pid inside the container (what the agent must find by its port)."""
        out = _run("nsenter", "-t", str(self.pid), "-a", "/bin/sh", "-c",
                   "for d in /proc/[0-9]*; do tr '\\0' ' ' < $d/cmdline | grep -q '^[^ ]*python -m kneeswarm.target' "
                   "&& echo ${d#/proc/}; done; true").stdout.split()
        return int(out[0])

    def stop(self) -> None:
        for d in self.debug:
            d.stop()
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)  # PID 1 gone: the kernel kills the namespace's others
            except ProcessLookupError:
                pass
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        _run("ip", "link", "del", self.veth, check=False)
        _run("ip", "netns", "del", self.netns, check=False)
        deadline = time.monotonic() + 10
        for cg in (self.cgroup, self.acct):
            while cg.exists() and time.monotonic() < deadline:
                try:
                    for pid in (cg / "cgroup.procs").read_text().split():
                        (cg.parent / "cgroup.procs").write_text(pid)
                    cg.rmdir()
                except OSError:
                    time.sleep(0.2)

    @property
    def acct(self) -> Path:
        return ACCT_CGROUP / self.cgroup.name


@dataclass
class DebugContainer:
    """kubectl debug --target, made of namespaces: this machine's userland in the container's PID
    and network namespaces, with a /proc of that PID namespace."""

    proc: subprocess.Popen
    pid: int  # its sleeping main process, as this machine sees it

    def prefix(self) -> list[str]:
        return ["nsenter", "-t", str(self.pid), "-a", "env", "-i", "PATH=/usr/local/bin:/usr/bin:/bin",
                "HOME=/root"]

    def stop(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def _descendant(proc: subprocess.Popen, want: str, timeout: float) -> int:
    """The pid of the first descendant of ``proc`` whose command line contains ``want``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        try:
            for c in psutil.Process(proc.pid).children(recursive=True):
                if want in " ".join(c.cmdline()):
                    return c.pid
        except psutil.Error:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"no process {want!r} under {proc.pid} within {timeout:g}s")


def start_container(tmp: Path, python: bool, server_args: list[str]) -> Container:
    """Build the root, the network namespace and the cgroup, and start the container with the demo
    target listening on 0.0.0.0 inside (``server_args``: its flags after ``--port``)."""
    tag = uuid.uuid4().hex[:6]
    subnet = 100 + int(tag, 16) % 100
    c = Container(name=f"ctr-{tag}", root=tmp / f"root-{tag}", ip=f"10.214.{subnet}.2", port=8000,
                  path=PYTHON_PATH if python else BUSYBOX_PATH, netns=f"kswx-{tag}", veth=f"kswx{tag}",
                  cgroup=CPU_CGROUP / f"kneeswarm-exec-{tag}")
    make_rootfs(c.root, python)
    try:
        _run("ip", "netns", "add", c.netns)
        _run("ip", "link", "add", c.veth, "type", "veth", "peer", "name", f"kswy{tag}")
        _run("ip", "link", "set", f"kswy{tag}", "netns", c.netns)
        _run("ip", "addr", "add", f"10.214.{subnet}.1/30", "dev", c.veth)
        _run("ip", "link", "set", c.veth, "up")
        for args in (("addr", "add", f"{c.ip}/30", "dev", f"kswy{tag}"), ("link", "set", f"kswy{tag}", "up"),
                     ("link", "set", "lo", "up")):
            _run("ip", "netns", "exec", c.netns, "ip", *args)
        c.cgroup.mkdir()
        (c.cgroup / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (c.cgroup / "cpu.cfs_quota_us").write_text(str(QUOTA_US))
        if ACCT_CGROUP.exists() and ACCT_CGROUP != CPU_CGROUP:
            c.acct.mkdir()
        binds = sorted({sys.base_prefix, sys.prefix, str(REPO), "/usr/lib", "/usr/lib64"})
        server = [sys.executable, "-m", "kneeswarm.target", "--host", "0.0.0.0", "--port", str(c.port), *server_args]
        (tmp / f"init-{tag}.sh").write_text(INIT)
        acct = f" && echo $$ > {c.acct}/cgroup.procs" if c.acct.exists() else ""
        enter = (f"echo $$ > {c.cgroup}/cgroup.procs{acct} && exec ip netns exec {c.netns} unshare --pid --mount --uts "
                 f"--ipc --fork --propagation private sh {tmp}/init-{tag}.sh \"$@\"")
        env = {"BINDS": " ".join(binds), "CGROUPS": "cpu cpuacct memory", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "PYTHONDONTWRITEBYTECODE": "1"}
        c.proc = subprocess.Popen(["/bin/sh", "-c", enter, "sh", str(c.root), "env", "-i", f"PATH={c.path}",
                                   "HOME=/root", "PYTHONDONTWRITEBYTECODE=1", *server],
                                  env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)
        c.pid = _descendant(c.proc, "& wait", 10.0)
        _wait_ready(c)
        return c
    except BaseException:
        c.stop()
        raise


def _wait_ready(c: Container) -> None:
    import requests

    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        try:
            if requests.get(c.url + "/v2/health/ready", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        if c.proc is not None and c.proc.poll() is not None:
            raise RuntimeError(f"container exited {c.proc.returncode}: {c.proc.stderr.read() if c.proc.stderr else ''}")
        time.sleep(0.2)
    raise RuntimeError(f"the container's server did not answer at {c.url} within {START_TIMEOUT:g}s")


def start_debug(c: Container, lifetime: float = 600.0) -> DebugContainer:
    """A debug container for ``c`` (kubectl debug --target): nsenter into its PID and network
    namespaces, then a mount namespace of its own with a /proc of that PID namespace."""
    proc = subprocess.Popen(["nsenter", "-t", str(c.pid), "--pid", "--net", "--uts", "--ipc", "--",
                             "unshare", "--mount", "--fork", "--mount-proc", "--propagation", "private",
                             "sleep", f"{lifetime:g}"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    d = DebugContainer(proc=proc, pid=_descendant(proc, "sleep", 10.0))
    c.debug.append(d)
    return d

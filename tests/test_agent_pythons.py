"""The remote agent on every python3 a monitored host may have (3.6, the default of RHEL 8 and
Ubuntu 18.04, and up): its whole lifecycle -- preflight, echo (clock), start, watch, fetch, stop,
verified manifest -- under each interpreter this machine has (pyenv's versions), run as the SSH
path runs it on a bare host: ``python3 -I -S`` (no site-packages, no user environment).

The interpreters run side by side (one thread each), so the test costs one lifecycle, not eight.
"""

from __future__ import annotations

import glob
import http.server
import json
import re
import shutil
import subprocess
import threading
import time

import pandas as pd
import pytest

from kneeswarm.agents import AgentSettings, open_agent
from kneeswarm.agents.hosts import each
from kneeswarm.agents.local import LocalTransport
from kneeswarm.contracts.plan import HostPlan
from kneeswarm.contracts.rundir import RunDir

try:
    from sshd_fixture import REPO, collector_pids, start_busy, stop_proc, wait_until_gone
except ImportError:  # tests/ imported as a package
    from tests.sshd_fixture import collector_pids, start_busy, stop_proc, wait_until_gone

#: The oldest python3 the agent supports (RHEL 8's and Ubuntu 18.04's, still common under GPU servers).
OLDEST = (3, 6)
PYENV_GLOB = "/root/.pyenv/versions/*/bin/python3"
HAVE_TOOLS = shutil.which("pidstat") and shutil.which("vmstat")


def _version(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=20).stdout
    except OSError:
        return None
    m = re.fullmatch(r"(\d+)\.(\d+)\s*", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def interpreters() -> dict[tuple[int, int], str]:
    """{(major, minor): path} of every python3 >= OLDEST on this machine (pyenv's, then PATH's)."""
    found: dict[tuple[int, int], str] = {}
    for path in sorted(glob.glob(PYENV_GLOB)) + [p for p in [shutil.which("python3")] if p]:
        v = _version(path)
        if v is not None and v >= OLDEST:
            found.setdefault(v, path)
    return dict(sorted(found.items()))


PYTHONS = interpreters()


#: Imports every module of the agent's zipapp (not main): every def, class and module-level
#: annotation is evaluated, so ``int | None`` in a signature fails on 3.6-3.9 here, not only new syntax.
LOAD_CODE = ("import sys, zipfile; sys.path.insert(0, sys.argv[1]); import importlib; "
             "names = sorted(n[:-3].replace('/', '.') for n in zipfile.ZipFile(sys.argv[1]).namelist() "
             "if n.startswith('remote/') and n.endswith('.py')); "
             "[importlib.import_module(n[:-len('.__init__')] if n.endswith('.__init__') else n) for n in names]; "
             "print(len(names))")


def test_the_agent_zipapp_loads_on_every_python3_here(tmp_path):
    """A syntax or annotation newer than the oldest interpreter fails here in a second."""
    from kneeswarm.agents.bundle import PACKAGE, write_agent_zipapp

    assert PYTHONS, "no python3 found"
    pyz = write_agent_zipapp(tmp_path / "remote.pyz")
    for v, python in PYTHONS.items():
        r = subprocess.run([python, "-I", "-S", "-c", LOAD_CODE, str(pyz)], capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 0, f"python {v}: {r.stderr.strip().splitlines()[-1:]}"
        assert int(r.stdout) == len(list(PACKAGE.glob("*.py")))  # every module of the package was imported


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TOOLS, reason="pidstat/vmstat (sysstat, procps) not installed")
def test_agent_lifecycle_on_every_python3_here(tmp_path):
    if OLDEST not in PYTHONS:
        pytest.skip(f"no python {OLDEST[0]}.{OLDEST[1]} on this machine (pyenv install 3.6)")
    busy = start_forking_busy()
    child = int(busy.stdout.readline())
    metrics = metrics_server()  # the prometheus sampler's urllib scrape, under each interpreter too
    url = f"http://127.0.0.1:{metrics.server_address[1]}/metrics"
    try:
        results = each(list(PYTHONS.items()), lambda item: _lifecycle(tmp_path, busy.pid, child, url, *item))
    finally:
        stop_proc(busy)
        metrics.shutdown()
    failed = {v: r for (v, _), r in zip(PYTHONS.items(), results) if isinstance(r, BaseException)}
    assert not failed, {f"{v[0]}.{v[1]}": f"{type(e).__name__}: {e}" for v, e in failed.items()}


METRICS_TEXT = b"# TYPE probe_total counter\nprobe_total 42\n"
#: A process whose child keeps a core busy: the service is a tree of two (the agent's tree.py).  The
#: child ends when its parent is gone however the parent ended (a SIGTERM runs no ``finally``: a child
#: that only waited for the parent's kill kept a core busy for as long as the machine ran, and moved
#: the CPU findings of every run after it).
FORKING_BUSY = ("import os, sys, time\nparent = os.getpid()\npid = os.fork()\nif pid == 0:\n"
                "    while os.getppid() == parent:\n        for _ in range(100000):\n            pass\n"
                "    os._exit(0)\n"
                "print(pid, flush=True)\ntry:\n    time.sleep(600)\nfinally:\n    os.kill(pid, 9)\n")


def start_forking_busy() -> subprocess.Popen:
    import sys

    return subprocess.Popen([sys.executable, "-c", FORKING_BUSY], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)


def metrics_server() -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(METRICS_TEXT)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _lifecycle(tmp: object, pid: int, child: int, url: str, version: tuple[int, int], python: str) -> None:
    name = f"py{version[0]}{version[1]}"
    run = RunDir.create(tmp, name)  # type: ignore[arg-type]
    host = HostPlan(pid=pid, collectors=["pidstat", "vmstat", "procfs", "prometheus", "cgroup"])
    transport = LocalTransport(label="local", python=[python, "-I", "-S"])
    settings = AgentSettings(interval=0.5, max_duration=60, heartbeat_timeout=10, metrics_url=url)
    with open_agent(host, run, settings, transport=transport) as agent:
        facts = agent.preflight()
        assert facts["python"].startswith(f"{version[0]}.{version[1]}."), facts["python"]
        assert facts["process"]["pid"] == pid
        agent.start()
        remote_dir, pids = agent.remote_dir, collector_pids(agent.start_status)
        assert {"pidstat", "vmstat"} <= set(pids), agent.start_status
        time.sleep(2.5)  # > 3 samples at 0.5 s, heartbeats on the watch channel
        agent.fetch()
        info = agent.stop()
        assert info["reason"].startswith("signal"), info
        agent.fetch(final=True)
        assert agent.fetch_info["verified"], agent.fetch_info
        agent.write_parsed()
        meta = agent.meta()
    assert wait_until_gone(remote_dir, pids, 5.0) == []
    assert meta["complete"] and meta["clock"]["before"] is not None and meta["clock"]["after"] is not None
    hd = run.host_dir("local")
    proc = pd.read_csv(hd / "process.csv")
    assert len(proc) >= 3 and set(proc["pid"]) == {pid, child}  # pidstat on the tree (TREE_SCRIPT)
    assert len(pd.read_csv(hd / "vmstat.csv")) >= 3
    procfs = pd.read_csv(hd / "process.procfs.csv")
    assert len(procfs) >= 3 and procfs["cpu_pct"].mean() > 1  # the busy child, seen by the /proc sampler (contended)
    tree = pd.read_csv(hd / "tree.procfs.csv")  # the service's two processes, as this python's agent saw them
    assert set(tree["pid"]) == {pid, child} and (tree.loc[tree["pid"] == child, "ppid"] == pid).all()
    assert tree.loc[tree["pid"] == child, "cpu_pct"].mean() > 1 and (tree.loc[tree["pid"] == child, "role"] == "worker").all()
    scrapes = [json.loads(x) for x in (run.raw_dir("local") / "prometheus.jsonl").read_text().splitlines()]
    assert len(scrapes) >= 3 and all(s.get("text") == METRICS_TEXT.decode() for s in scrapes), [s for s in scrapes if s.get("text") != METRICS_TEXT.decode()][:2]
    cgroup = pd.read_csv(hd / "cgroup.csv")  # the process's cgroup, read by the sampler on this python
    # full samples name the version (and the memory usage); where the process has a CPU quota the sampler
    # adds counter-only rows between them (CgroupSampler.full_every), which carry neither by design
    full = cgroup["memory_usage_mb"].notna()
    assert len(cgroup) >= 3 and full.any() and cgroup["version"][full].notna().all() and cgroup["pid"].eq(pid).all()


def test_exec_channel_file_ops_on_every_python3_here(tmp_path):
    """ssh.EXEC_FILE_OPS (files over the exec channel, where a server has no sftp subsystem) runs
    on the host's python3 too: put (sha256 answered), sizes, read, mkdir under each interpreter."""
    import hashlib

    from kneeswarm.agents.ssh import EXEC_FILE_OPS

    data = bytes(range(256)) * 40
    for v, python in PYTHONS.items():
        d = tmp_path / f"py{v[0]}{v[1]}"

        def op(*args: str, stdin: bytes | None = None) -> bytes:
            r = subprocess.run([python, "-c", EXEC_FILE_OPS, *args], input=stdin, capture_output=True, timeout=30)
            assert r.returncode == 0, f"python {v}: {args[0]}: {r.stderr.decode()[-300:]}"
            return r.stdout

        op("mkdir", str(d / "a" / "b"))
        assert op("put", str(d / "a" / "f"), "640", stdin=data).decode().strip() == hashlib.sha256(data).hexdigest()
        assert (d / "a" / "f").stat().st_mode & 0o777 == 0o640
        assert json.loads(op("sizes", str(d / "a"))) == {"f": len(data)}
        assert op("read", str(d / "a" / "f"), "100", "50") == data[100:150]

"""The shape of the agents: remote.pyz needs only the standard library, a collector is one module
(registered at runtime here, it runs on the real local agent and reaches hosts/<host>/ parsed),
selection and the remote agent name no collector, and several hosts are driven at once."""

from __future__ import annotations

import ast
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import tzinfo
from pathlib import Path
from typing import Any, Iterator

import pandas as pd
import pytest

from kneeswarm import collectors
from kneeswarm.agents import AgentError, AgentSettings, HostAgents, open_agent
from kneeswarm.agents import host as host_mod
from kneeswarm.agents.bundle import write_agent_zipapp
from kneeswarm.agents.remote.defaults import SCRIPT_FILE
from kneeswarm.collectors.base import Collector, Parsed, frame
from kneeswarm.contracts.plan import HostPlan
from kneeswarm.contracts.planfile import load_plan
from kneeswarm.contracts.rundir import RunDir
from conftest import wait_for

REPO = Path(__file__).resolve().parents[1]
REMOTE = REPO / "agents" / "remote"  # the agent package (shipped as one zipapp)
OPTIONAL_IMPORTS = {"pynvml"}  # imported only inside try/except ImportError


def _imports(tree: ast.AST) -> list[tuple[str, ast.AST]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name.split(".")[0], node) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            out.append((node.module.split(".")[0], node))
    return out


def _guarded_imports(tree: ast.AST) -> set[int]:
    """ids of import nodes inside a ``try`` whose handlers catch ImportError (or Exception)."""
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try):
            caught = {ast.unparse(h.type) for h in node.handlers if h.type is not None}
            if caught & {"ImportError", "Exception", "ModuleNotFoundError"}:
                guarded |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return guarded


def _package_trees() -> dict[str, ast.AST]:
    return {p.name: ast.parse(p.read_text()) for p in sorted(REMOTE.glob("*.py"))}


def test_remote_imports_only_the_standard_library_and_its_own_modules():
    foreign = []
    for name, tree in _package_trees().items():
        guarded = _guarded_imports(tree)
        for mod, node in _imports(tree):  # absolute imports; the package's own are relative (level 1)
            if mod not in sys.stdlib_module_names and not (mod in OPTIONAL_IMPORTS and id(node) in guarded):
                foreign.append((name, mod, node.lineno))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level > 1:
                foreign.append((name, "." * node.level + (node.module or ""), node.lineno))
    assert not foreign, foreign
    optional = [mod for tree in _package_trees().values() for mod, _ in _imports(tree) if mod in OPTIONAL_IMPORTS]
    assert optional, "the check must see pynvml, the one optional import"


def test_remote_runs_without_site_packages(tmp_path):
    """Isolated mode, no site: only the standard library can be imported."""
    pyz = write_agent_zipapp(tmp_path / SCRIPT_FILE)  # as deploy uploads it
    out = subprocess.run([sys.executable, "-I", "-S", str(pyz), "preflight",
                          json.dumps({"pid": os.getpid()})], capture_output=True, text=True, timeout=60,
                         env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, cwd=tmp_path)
    facts = json.loads(out.stdout)
    assert out.returncode == 0 and facts["ok"] and facts["process"]["pid"] == os.getpid(), out.stderr


def _string_compares(tree: ast.AST) -> set[str]:
    """String constants used in comparisons (==, !=, in, is)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                if isinstance(side, ast.Constant) and isinstance(side.value, str):
                    out.add(side.value)
    return out


def test_selection_and_remote_name_no_collector():
    names = set(collectors.COLLECTORS)
    sel = ast.parse((REPO / "agents" / "selection.py").read_text())
    literals = {n.value for n in ast.walk(sel) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert not literals & names, literals & names
    for remote in _package_trees().values():
        assert not _string_compares(remote) & names
        sampler_classes = {"ProcfsSampler", "NvmlSampler", "PrometheusSampler"}
        compared = {ast.unparse(c) for n in ast.walk(remote) if isinstance(n, ast.Compare) for c in n.comparators}
        assert not compared & sampler_classes, compared & sampler_classes


# -- a throwaway collector, registered at runtime ---------------------------------------------
COUNTER_CODE = ("import time\nfor i in range(10**6):\n"
                "    print(f'{time.time():.3f} {i}', flush=True)\n    time.sleep(0.2)\n")


class CounterCollector(Collector):
    """Prints 't n' five times a second; table ``counter``: t, n."""

    name = "counter"
    raw_file = "counter.txt"
    tables = ("counter",)
    output_tz = None

    def check_argv(self) -> list[str] | None:
        return [sys.executable, "-c", "print('counter 1.0')"]

    def version_from(self, text: str) -> str | None:
        return text.split()[-1] if text.strip() else None

    def command(self, pid, interval, version=None):
        return [sys.executable, "-c", COUNTER_CODE], {}

    def parse_text(self, text: str, tz: tzinfo | None, t0: float | None, interval: float) -> Parsed:
        rows = [[float(a), int(b)] for a, b in (line.split() for line in text.splitlines())]
        return Parsed({"counter": frame(rows, ["t", "n"])}, len(rows), 0)


class BrokenCollector(CounterCollector):
    """The same command; a parser that raises."""

    name = "broken"
    raw_file = "broken.txt"
    tables = ("broken",)

    def parse_text(self, text: str, tz: tzinfo | None, t0: float | None, interval: float) -> Parsed:
        raise ValueError("this parser is broken")


def test_a_collector_registered_at_runtime_runs_and_reaches_hosts_parsed(tmp_path, monkeypatch):
    monkeypatch.setitem(collectors.COLLECTORS, "counter", CounterCollector())
    monkeypatch.setitem(collectors.COLLECTORS, "broken", BrokenCollector())
    run = RunDir.create(tmp_path, "shape")
    with open_agent(HostPlan(collectors=["counter", "broken"]), run, AgentSettings(heartbeat_timeout=10)) as agent:
        facts = agent.preflight()
        assert facts["collectors"]["counter"]["enabled"] and facts["collectors"]["counter"]["version"] == "1.0"
        agent.start()
        time.sleep(2.0)
        agent.stop()
        agent.fetch(final=True)
        stats = agent.write_parsed()
        meta = agent.meta()
    raw = [line.split() for line in (run.raw_dir("local") / "counter.txt").read_text().splitlines()]
    df = pd.read_csv(run.host_dir("local") / "counter.csv")
    assert len(df) == len(raw) >= 5 and df["n"].tolist() == [int(r[1]) for r in raw]
    # the parser that raised: its error is in the stats and in meta, and counted as lost
    assert stats["broken"]["error"] == "ValueError: this parser is broken"
    assert meta["parse"]["broken"]["error"] and meta["lost"] == {"parser_errors": 1}
    assert meta["complete"] is False and meta["parse"]["counter"]["error"] is None


def test_collector_children_get_sigint_back_even_when_the_controller_ignores_it(tmp_path):
    pyz = write_agent_zipapp(tmp_path / SCRIPT_FILE)
    cfg = {"heartbeat_timeout": 60, "max_duration": 30,
           "collectors": [{"name": "sleep", "argv": ["sleep", "30"], "raw_file": "sleep.txt"}]}
    (tmp_path / "agent.json").write_text(json.dumps(cfg))
    ignore = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)  # noqa: E731 - a background job
    out = subprocess.run([sys.executable, str(pyz), "start", str(tmp_path / "agent.json")],
                         capture_output=True, text=True, timeout=30, preexec_fn=ignore)
    try:
        pid = json.loads(out.stdout)["status"]["collectors"]["sleep"]["pid"]
        sig_ign = next(int(line.split()[1], 16) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                       if line.startswith("SigIgn:"))
        assert not sig_ign & (1 << (signal.SIGINT - 1))
    finally:
        subprocess.run([sys.executable, str(pyz), "stop", str(tmp_path)], capture_output=True,
                       timeout=60)


# -- several hosts at once -------------------------------------------------------------------
def _plan(tmp_path, names):
    plan = load_plan(None, {"name": "hosts"})
    plan.hosts = [HostPlan(name=n, collectors=["vmstat"]) for n in names]
    return plan


def two_hosts_finished(tmp_path: Path) -> tuple[RunDir, dict[str, Any]]:
    """Agents on hosts a and b (vmstat alone) opened, started, and finished once each one's raw
    file holds a sample of the run (two header lines, the since-boot line, one more): (the run,
    meta per host)."""
    run = RunDir.create(tmp_path, "hosts")
    with HostAgents.open(_plan(tmp_path, ["a", "b"]), run) as agents:
        agents.preflight_all()
        agents.start_all()
        raws = [Path(a.remote_dir) / "vmstat.txt" for a in agents]
        wait_for(lambda: all(r.is_file() and len(r.read_bytes().splitlines()) >= 4 for r in raws), 10,
                 "a vmstat sample of the run on each host")
        return run, agents.finish_all()


@pytest.mark.skipif(not shutil.which("vmstat"), reason="vmstat (procps) not installed")
def test_hosts_are_driven_concurrently(tmp_path, monkeypatch):
    """Every step waits at a barrier for the other host: one after the other would break it."""
    barrier = threading.Barrier(2, timeout=20)
    for verb in ("preflight", "start", "stop", "fetch"):
        real = getattr(host_mod.HostAgent, verb)

        def together(self, *a, _real=real, **kw):
            barrier.wait()
            return _real(self, *a, **kw)

        monkeypatch.setattr(host_mod.HostAgent, verb, together)
    run, meta = two_hosts_finished(tmp_path)
    assert [meta[h]["fetch"]["verified"] for h in ("a", "b")] == [True, True]
    assert all(len(pd.read_csv(run.host_dir(h) / "vmstat.csv")) >= 1 for h in ("a", "b"))


@pytest.mark.skipif(not shutil.which("vmstat"), reason="vmstat (procps) not installed")
def test_one_hosts_failure_is_its_own(tmp_path, monkeypatch):
    real_stop = host_mod.HostAgent.stop

    def stop(self):
        out = real_stop(self)
        if self.label == "a":
            raise AgentError(f"{self.label}: stop answered garbage")
        return out

    monkeypatch.setattr(host_mod.HostAgent, "stop", stop)
    run, meta = two_hosts_finished(tmp_path)
    assert "stop failed: stop answered garbage" in meta["a"]["warnings"]
    assert not any("stop failed" in w for w in meta["b"]["warnings"])
    assert meta["a"]["fetch"]["verified"] and meta["b"]["fetch"]["verified"]


# -- a final fetch that cannot be verified -----------------------------------------------------
@contextlib.contextmanager
def vmstat_agent(run: RunDir, lines: int) -> Iterator[Any]:
    """A local agent running vmstat alone, yielded once its raw file has ``lines`` lines."""
    with open_agent(HostPlan(collectors=["vmstat"]), run) as agent:
        agent.preflight()
        agent.start()
        raw = Path(agent.remote_dir) / "vmstat.txt"
        wait_for(lambda: raw.is_file() and len(raw.read_bytes().splitlines()) >= lines, 10, f"{lines} lines of vmstat")
        yield agent


@pytest.mark.skipif(not shutil.which("vmstat"), reason="vmstat (procps) not installed")
def test_checksum_mismatch_marks_the_host_incomplete_and_still_parses(tmp_path):
    run = RunDir.create(tmp_path, "verify")
    # two header lines and two samples: the first (averages since boot) is not a sample of the run
    with vmstat_agent(run, lines=4) as agent:
        agent.stop()
        remote_dir = agent.remote_dir
        with open(Path(remote_dir) / "vmstat.txt", "r+b") as f:  # changed after MANIFEST.json was written
            f.write(b"#")
        agent.fetch(final=True)
        agent.write_parsed()
        meta = agent.meta()
    try:
        assert meta["complete"] is False and meta["lost"] == {"unverified_files": 1}
        assert meta["fetch"]["verified"] is False and meta["fetch"]["mismatched"] == ["vmstat.txt"]
        assert meta["parsed_verified"] is False and meta["parse"]["vmstat"]["tables"]["vmstat"] >= 1
        assert os.path.isdir(remote_dir)  # kept: the host still has what did not match
        assert any("did not match" in w for w in meta["warnings"])
    finally:
        shutil.rmtree(remote_dir, ignore_errors=True)


@pytest.mark.skipif(not shutil.which("vmstat"), reason="vmstat (procps) not installed")
def test_failed_final_fetch_marks_the_host_incomplete(tmp_path):
    run = RunDir.create(tmp_path, "gone")
    with vmstat_agent(run, lines=1) as agent:
        agent.fetch()
        agent.stop()
        shutil.rmtree(agent.remote_dir)
        agent.fetch(final=True)
        agent.write_parsed()
        meta = agent.meta()
    assert meta["complete"] is False and meta["lost"]["unverified_files"] >= 1
    assert any(w.startswith("final fetch failed") for w in meta["warnings"]), meta["warnings"]
    assert (run.host_dir("local") / "vmstat.csv").exists()  # what arrived before is still parsed


def test_pidstat_stands_in_for_the_proc_sampler_only_where_the_python_agent_cannot_run():
    from kneeswarm.agents import selection

    pidstat_ok = {"found": True, "rc": 0, "output": "sysstat version 12.6.1"}
    python_host = {"tools": {"pidstat": pidstat_ok}, "procfs": True}
    sel = selection.select(python_host, None, 123, AgentSettings(), "h")
    assert "procfs" in sel.enabled and "pidstat" not in sel.enabled and "pidstat" in sel.quiet
    spec = next(s for s in sel.specs if s.name == "procfs")  # threads read less often than the process
    assert spec.params["thread_interval"] > spec.interval
    shell_host = {"tools": {"pidstat": pidstat_ok}, "procfs": True, "samplers": []}  # remote.sh: no sampler
    sel = selection.select(shell_host, None, 123, AgentSettings(), "h")
    assert "pidstat" in sel.enabled and "procfs" in sel.skipped and "procfs" in sel.quiet
    assert not any("procfs" in line for line in sel.news)  # the agent's note says what the shell agent lost
    sel = selection.select(python_host, ["pidstat", "procfs"], 123, AgentSettings(), "h")  # listed: both run
    assert {"pidstat", "procfs"} <= set(sel.enabled)

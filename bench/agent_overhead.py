"""Agent overhead on the monitored host: CPU% and RSS of the host agent (agents/remote/) and its
collectors, sampled with psutil at 1 Hz while the agent records a real process.

    .venv/bin/python bench/agent_overhead.py [--seconds 60] [--threads 256] [--transport local,ssh] [--ssh ...]

What is measured, per transport: the agent daemon's process (its own session and process group,
started by ``remote.pyz start``) and every descendant of it (pidstat, vmstat, ... each in a group of
its own), summed; with SSH, also the sshd session processes that serve the controller's heartbeats
and incremental fetches (they run on the monitored host because of the agent).  The controller
renews the heartbeat every few seconds and fetches every FETCH_PERIOD seconds, as in a run.

The monitored process has ``--threads`` threads (default 256: a real inference server has many, and
pidstat -t read every one of them each second; the /proc sampler every THREAD_INTERVAL seconds), each waking every
THREAD_WAKE seconds; ``--threads 0`` monitors the bundled demo target (ONNX Runtime mode) instead.  For SSH, without ``--ssh``, a private sshd on
loopback is started from tests/sshd_fixture.py when /usr/sbin/sshd exists (else SSH is skipped).

Verdict per transport against the target: mean CPU <= 1% of one core and peak RSS <= 50 MB.

``--compare`` measures, in the same run and right before, the old default collectors
(pidstat -t reading every thread each second instead of the agent's /proc sampler, which reads the
threads every THREAD_INTERVAL seconds) and prints the ratio of the two means: the machine's other
load weighs on both alike.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kneeswarm.agents import AgentSettings, open_agent  # noqa: E402
from kneeswarm.contracts.plan import HostPlan  # noqa: E402
from kneeswarm.contracts.rundir import RunDir  # noqa: E402

logger = logging.getLogger(__name__)

SECONDS = 60.0  # default measuring time per transport
PERIOD = 1.0  # psutil sampling period (1 Hz)
FETCH_PERIOD = 5.0  # seconds between incremental fetches (the conductor's FETCH_PERIOD)
TARGET_CPU_PCT = 1.0  # of one core
#: ``--compare``: the old default collectors, before the /proc thread sampler (pidstat -t each second).
BASELINE_COLLECTORS = ["pidstat", "vmstat", "cgroup", "fds"]
TARGET_RSS_MB = 50.0
TARGET_ARGS = ["--mode", "onnx", "--request-threads", "4"]
THREADS = 256  # threads of the monitored process
THREAD_WAKE = 0.5  # seconds each of its threads sleeps between wake-ups
MANY_THREADS_CODE = """
import sys, threading, time
def idle():
    while True:
        time.sleep({wake})
for _ in range({n}):
    threading.Thread(target=idle, daemon=True).start()
print("ready", flush=True)
time.sleep(3600)
"""


@dataclass
class Series:
    cpu: list[float] = field(default_factory=list)  # % of one core, per period
    rss: list[float] = field(default_factory=list)  # MB


class TreeMeter:
    """CPU% (of one core) and RSS of process trees, by component name, one ``tick`` per period."""

    def __init__(self) -> None:
        self.last: dict[int, tuple[float, float]] = {}  # pid -> (create_time, cpu seconds)
        self.series: dict[str, Series] = {}
        self.t_last = time.monotonic()

    def tick(self, groups: dict[str, list[psutil.Process]]) -> None:
        now = time.monotonic()
        dt = max(1e-6, now - self.t_last)
        self.t_last = now
        seen: dict[int, tuple[float, float]] = {}
        for name, procs in groups.items():
            cpu = rss = 0.0
            for p in procs:
                try:
                    with p.oneshot():
                        ct = p.cpu_times()
                        used = ct.user + ct.system
                        key = p.create_time()
                        mem = p.memory_info().rss
                except psutil.Error:
                    continue  # gone between the listing and the read
                prev = self.last.get(p.pid)
                # a process new since the last tick is counted from zero: its start-up cost is real
                cpu += used - (prev[1] if prev and prev[0] == key else 0.0)
                rss += mem
                seen[p.pid] = (key, used)
            s = self.series.setdefault(name, Series())
            s.cpu.append(100.0 * cpu / dt)
            s.rss.append(rss / 2**20)
        self.last = seen

    def reset(self) -> None:
        """Forget the samples so far (keep the per-process baselines)."""
        self.series.clear()


def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def component_groups(agent_pid: int, collector_pids: dict[str, int], sshd_pid: int | None) -> dict[str, list[psutil.Process]]:
    """{"agent (remote.pyz)": [...], "<collector>": [...], "sshd sessions": [...]}."""
    by_pid = {pid: name for name, pid in collector_pids.items()}
    groups: dict[str, list[psutil.Process]] = {"agent (remote.pyz)": []}
    for p in tree(agent_pid):
        name = "agent (remote.pyz)"
        try:
            q: psutil.Process | None = p
            while q is not None and q.pid != agent_pid:  # a collector or a descendant of one
                if q.pid in by_pid:
                    name = by_pid[q.pid]
                    break
                q = q.parent()
        except psutil.Error:
            pass
        groups.setdefault(name, []).append(p)
    if sshd_pid is not None:
        agent_tree = {p.pid for p in tree(agent_pid)}
        groups["sshd sessions"] = [p for p in tree(sshd_pid)[1:] if p.pid not in agent_tree]
    return groups


def measure(host: HostPlan, label: str, seconds: float, sshd_pid: int | None = None) -> dict[str, Series]:
    with tempfile.TemporaryDirectory(prefix="kneeswarm-bench-") as tmp:
        run = RunDir.create(tmp, f"overhead-{label}")
        with open_agent(host, run, AgentSettings(interval=1, max_duration=seconds, heartbeat_timeout=30)) as agent:
            agent.preflight()
            status = agent.start()
            agent_pid = int(status["agent_pid"])
            collectors = {n: int(c["pid"]) for n, c in (status.get("collectors") or {}).items() if c.get("pid")}
            samplers = [n for n, c in (status.get("collectors") or {}).items() if c.get("kind") == "sampler"]
            print(f"[{label}] agent pid {agent_pid}; commands {sorted(collectors)}; in-process samplers {samplers}; "
                  f"{seconds:.0f}s at 1 Hz ...", file=sys.stderr, flush=True)
            meter = TreeMeter()
            meter.tick(component_groups(agent_pid, collectors, sshd_pid))  # baseline
            meter.reset()
            started = last_fetch = time.monotonic()
            k = 1
            while time.monotonic() - started < seconds:
                time.sleep(max(0.0, started + k * PERIOD - time.monotonic()))
                k += 1
                meter.tick(component_groups(agent_pid, collectors, sshd_pid))
                if time.monotonic() - last_fetch >= FETCH_PERIOD:
                    agent.fetch()
                    last_fetch = time.monotonic()
            agent.stop()
            agent.fetch(final=True)
            fetched = agent.fetch_info.get("bytes", 0)
        print(f"[{label}] {fetched / 1024:.0f} KiB of raw data recorded and fetched (verified)", file=sys.stderr)
        return meter.series


def p95(xs: list[float]) -> float:
    return sorted(xs)[max(0, int(round(0.95 * (len(xs) - 1))))] if xs else float("nan")


def report(label: str, series: dict[str, Series]) -> tuple[bool, float]:
    """Print the table and the verdict; (verdict, mean CPU % of one core of everything judged)."""
    n = max((len(s.cpu) for s in series.values()), default=0)
    total = Series(cpu=[sum(s.cpu[i] for s in series.values() if i < len(s.cpu)) for i in range(n)],
                   rss=[sum(s.rss[i] for s in series.values() if i < len(s.rss)) for i in range(n)])
    on_host_agent = Series(  # the agent and its collectors (what the target is about)
        cpu=[sum(s.cpu[i] for k, s in series.items() if k != "sshd sessions" and i < len(s.cpu)) for i in range(n)],
        rss=[sum(s.rss[i] for k, s in series.items() if k != "sshd sessions" and i < len(s.rss)) for i in range(n)])
    print(f"\n{label}: {n} samples at 1 Hz")
    print(f"  {'component':<26} {'cpu% mean':>9} {'cpu% p95':>9} {'cpu% max':>9} {'rss MB mean':>11} {'rss MB max':>10}")
    rows = [*sorted(series.items()), ("agent + collectors", on_host_agent)]
    if "sshd sessions" in series:
        rows.append(("all (incl. sshd)", total))
    for name, s in rows:
        if not s.cpu:
            continue
        print(f"  {name:<26} {statistics.fmean(s.cpu):>9.2f} {p95(s.cpu):>9.2f} {max(s.cpu):>9.2f} "
              f"{statistics.fmean(s.rss):>11.1f} {max(s.rss):>10.1f}")
    judged = total  # sshd's share is the agent's overhead too when the agent is reached over SSH
    cpu, rss = statistics.fmean(judged.cpu) if judged.cpu else float("nan"), max(judged.rss, default=float("nan"))
    ok = cpu <= TARGET_CPU_PCT and rss <= TARGET_RSS_MB
    print(f"  verdict: {'PASS' if ok else 'FAIL'}: mean {cpu:.2f}% of one core (target <= {TARGET_CPU_PCT:g}%), "
          f"peak RSS {rss:.1f} MB (target <= {TARGET_RSS_MB:g} MB)")
    return ok, cpu


def judged(kind: str, host: HostPlan, label: str, seconds: float, compare: bool, sshd_pid: int | None = None) -> bool:
    """Measure ``host`` (after the baseline collectors with ``compare``) and print the verdict."""
    base = None
    if compare:
        old = dataclasses.replace(host, collectors=list(BASELINE_COLLECTORS))
        _, base = report(f"{label}, baseline: {', '.join(BASELINE_COLLECTORS)}",
                         measure(old, f"{kind}-baseline", seconds, sshd_pid))
    ok, cpu = report(label, measure(host, kind, seconds, sshd_pid))
    if base is not None:
        print(f"  {label}: {cpu:.2f}% now vs {base:.2f}% with pidstat -t each second: ratio {cpu / base:.2f}"
              if base > 0 else f"  {label}: baseline measured 0%")
    return ok


def loopback_sshd(tmp: Path) -> Any:
    """A private sshd on loopback from the tests' fixture, or None (with the reason) if it cannot run."""
    sys.path.insert(0, str(REPO / "tests"))
    try:
        from sshd_fixture import SSHD

        return SSHD.start(tmp / "sshd")
    except BaseException as e:  # pytest.skip raises a BaseException when sshd is missing
        print(f"ssh: skipped ({e})", file=sys.stderr)
        return None


def monitored_process(threads: int) -> tuple[Any, Any]:
    """(process, stop function): a process of ``threads`` threads, or the demo target when 0."""
    if threads <= 0:
        from kneeswarm.launch.cli import start_target, stop_target

        proc, url = start_target(TARGET_ARGS)
        what, stop = f"demo target {url}", lambda: stop_target(proc)
    else:
        proc = subprocess.Popen([sys.executable, "-c", MANY_THREADS_CODE.format(n=threads, wake=THREAD_WAKE)],
                                stdout=subprocess.PIPE, text=True)
        proc.stdout.readline()  # "ready": every thread started
        what = f"a python process of {threads} threads waking every {THREAD_WAKE:g}s"

        def stop() -> None:
            proc.kill()
            proc.wait(timeout=10)
    print(f"monitored process: {what}, pid {proc.pid} ({len(psutil.Process(proc.pid).threads())} threads)",
          file=sys.stderr)
    return proc, stop


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=SECONDS, help=f"seconds per transport (default {SECONDS:g})")
    ap.add_argument("--transport", default="local,ssh", help="comma-separated: local, ssh (default: both)")
    ap.add_argument("--threads", type=int, default=THREADS,
                    help=f"threads of the monitored process (default {THREADS}; 0: the demo target)")
    ap.add_argument("--compare", action="store_true",
                    help="measure the old default collectors first (pidstat -t) and print the ratio")
    ap.add_argument("--ssh", help="user@host[:port] of an existing sshd (default: a private one on loopback)")
    ap.add_argument("--key-file", help="with --ssh: private key")
    ap.add_argument("--known-hosts", help="with --ssh: known_hosts file")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="bench: %(levelname)s %(name)s: %(message)s")
    if args.seconds < 3:
        print("bench: error: --seconds must be at least 3", file=sys.stderr)
        return 2
    wanted = [t.strip() for t in args.transport.split(",") if t.strip()]
    bad = [t for t in wanted if t not in ("local", "ssh")]
    if bad:
        print(f"bench: error: --transport {','.join(bad)}: unknown (known: local, ssh)", file=sys.stderr)
        return 2

    proc, stop = monitored_process(args.threads)
    verdicts: dict[str, bool] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="kneeswarm-bench-ssh-") as tmp:
            for kind in wanted:
                if kind == "local":
                    host = HostPlan(name="local", pid=proc.pid)
                    verdicts["local"] = judged("local", host, "local", args.seconds, args.compare)
                    continue
                server, sshd_pid = None, None
                if args.ssh:
                    host = HostPlan(name="ssh", ssh=args.ssh, key_file=args.key_file, known_hosts=args.known_hosts,
                                    pid=proc.pid)
                else:
                    server = loopback_sshd(Path(tmp))
                    if server is None:
                        continue
                    kh = server.write_known_hosts(Path(tmp) / "known_hosts")
                    host = HostPlan(name="ssh", ssh=server.target, key_file=str(server.user_key), known_hosts=str(kh),
                                    pid=proc.pid)
                    sshd_pid = server.proc.pid
                try:
                    verdicts["ssh"] = judged("ssh", host, "ssh (loopback)" if server else f"ssh {args.ssh}",
                                             args.seconds, args.compare, sshd_pid)
                finally:
                    if server is not None:
                        server.stop()
    finally:
        stop()
    print("\n" + ", ".join(f"{k}: {'PASS' if v else 'FAIL'}" for k, v in verdicts.items()))
    return 0 if verdicts and all(verdicts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

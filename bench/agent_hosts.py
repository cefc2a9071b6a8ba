"""Driving several monitored hosts at once: preflight, start, stop and finish (final fetch + parse)
times for 1 host and for N hosts (default 4), each a private sshd on loopback from
tests/sshd_fixture.py, and the ratio N/1; then N hosts one at a time (MAX_PARALLEL_HOSTS = 1) for
comparison. Hosts are driven concurrently, so the ratio should stay near 1 (on a machine with few
cores, the sshd and agent processes of every host still compete for them).

    .venv/bin/python bench/agent_hosts.py [--hosts 4] [--repeat 3] [--seconds 2]

Prints the median of ``--repeat`` runs per phase; asserts nothing (times are figures, not tests).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from kneeswarm.agents import HostAgents  # noqa: E402
from kneeswarm.agents import hosts as hosts_mod  # noqa: E402
from kneeswarm.contracts.plan import HostPlan
from kneeswarm.contracts.planfile import load_plan
from kneeswarm.contracts.rundir import RunDir  # noqa: E402

PHASES = ("open", "preflight", "start", "stop", "finish")
COLLECTORS = ["vmstat", "pidstat", "procfs"]


def one_run(servers: list[Any], tmp: Path, pid: int, seconds: float) -> dict[str, float]:
    """Seconds per phase for one run over ``servers``."""
    plan = load_plan(None, {"name": "bench-hosts"})
    plan.hosts = [HostPlan(name=f"h{i}", ssh=s.target, key_file=str(s.user_key),
                           known_hosts=str(s.write_known_hosts(tmp / f"known_hosts{i}")), pid=pid,
                           collectors=list(COLLECTORS)) for i, s in enumerate(servers)]
    run = RunDir.create(tmp, f"hosts{len(servers)}")
    times: dict[str, float] = {}
    t = time.perf_counter()
    with HostAgents.open(plan, run) as agents:
        times["open"] = time.perf_counter() - t
        for phase, op in (("preflight", agents.preflight_all), ("start", agents.start_all)):
            t = time.perf_counter()
            op()
            times[phase] = time.perf_counter() - t
        time.sleep(seconds)
        for phase, op in (("stop", agents.stop_all), ("finish", agents.finish_all)):
            t = time.perf_counter()
            op()
            times[phase] = time.perf_counter() - t
        meta = agents.meta()
    bad = [h for h, m in meta.items() if not m["complete"]]
    if bad:
        print(f"bench: warning: hosts not complete: {bad}", file=sys.stderr)
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=4, help="hosts of the second configuration (default 4)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per configuration (median; default 3)")
    ap.add_argument("--seconds", type=float, default=2.0, help="recording time per run (default 2)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR, format="bench: %(levelname)s %(name)s: %(message)s")
    from sshd_fixture import SSHD, start_busy, stop_proc

    busy = start_busy()
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="kneeswarm-bench-hosts-") as tmp:
        servers = [SSHD.start(Path(tmp) / f"sshd{i}") for i in range(args.hosts)]
        try:
            for key, n, parallel in (("1", 1, 32), ("n", args.hosts, 32), ("seq", args.hosts, 1)):
                hosts_mod.MAX_PARALLEL_HOSTS = parallel
                runs = [one_run(servers[:n], Path(tmp), busy.pid, args.seconds) for _ in range(args.repeat)]
                results[key] = {p: statistics.median(r[p] for r in runs) for p in PHASES}
        finally:
            for s in servers:
                s.stop()
            stop_proc(busy)
    n = args.hosts
    print(f"{'phase':<10} {'1 host s':>9} {f'{n} hosts s':>10} {'ratio':>6} {f'{n} one by one s':>16} {'ratio':>6}"
          f"   (median of {args.repeat})")
    for p in PHASES:
        one, many, seq = results["1"][p], results["n"][p], results["seq"][p]
        print(f"{p:<10} {one:>9.2f} {many:>10.2f} {many / one:>6.2f} {seq:>16.2f} {seq / one:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

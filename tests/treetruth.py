"""The kernel's own account of a served process tree, read by a test independently of the agent,
and the checks every real run on a forking server makes against it (tests/test_tree.py's
pre-fork demo target, tests_conformance/ TorchServe's Python workers and Triton's Python-backend
stubs).

The truth: /proc/PID/stat of the root and of every descendant, the tree found by ppid at each
reading.  A member's utime + stime is its own CPU; its cutime + cstime holds the whole time of
each child it reaped (the kernel adds it at the reap), so the sum of (u + s + cu + cs) over the
live members rises by exactly the tree's CPU between two readings, however many workers died and
were replaced between them (only a member reaped outside the tree, by init, takes its time away).
/proc/stat's first line gives the host's busy time over the same span: the tree's share of it is
what decides whether the host was full with the service's work or with others'.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

CLK_TCK = os.sysconf("SC_CLK_TCK")
PERIOD_S = 0.5  # how often the sampler reads the tree (a /proc scan: a few ms of the test's own CPU)
TREE_CPU_REL = 0.05  # the tree's CPU as the run recorded it, within 5 % of the kernel's counters
# The service did most of the host's busy CPU (the kernel's counters) in every step at or after the
# knee: then the CPU findings must blame it and host_contended must not fire.  Below OTHERS_SHARE in
# some such step, others filled the host and host_contended is what the rules should say.  Between
# the two (the rule's own threshold, 0.5, read on the agent's samples) either may hold.
SERVICE_SHARE = 0.55
OTHERS_SHARE = 0.45
HOST_FULL_PCT = 90.0  # the host's CPUs full, as the kernel counts them (the rules' own figure, cpu.py)
CPU_FINDINGS = {"cpu_saturated", "run_queue_over_cores", "threads_over_cores", "single_thread_bound"}


def stat_of(pid: int) -> tuple[int, int, int] | None:
    """(ppid, utime + stime, cutime + cstime) of ``pid`` in clock ticks; None once it is gone."""
    st = full_stat(pid)
    return None if st is None else st[:3]


def full_stat(pid: int) -> tuple[int, int, int, int] | None:
    """``stat_of`` and the process's start time (clock ticks since boot: a reused pid differs)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    f = text[text.rfind(")") + 2:].split()  # fields from the state (3rd) on: comm may hold spaces
    return int(f[1]), int(f[11]) + int(f[12]), int(f[13]) + int(f[14]), int(f[19])


def tree_of(root: int) -> list[int]:
    """``root`` and its descendants now, found by each process's ppid."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := stat_of(int(name))) is not None:
            children.setdefault(st[0], []).append(int(name))
    out, todo = [], [root]
    while todo:  # a tree: every pid has one parent, so this ends
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return sorted(out)


def marked(root: int, mark: str) -> dict[int, int]:
    """{pid: ppid} of the processes of ``root``'s tree whose command line holds ``mark`` (a
    server's workers, told by what they run)."""
    out = {}
    for pid in tree_of(root):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if mark in cmd and (st := stat_of(pid)) is not None:
            out[pid] = st[0]
    return out


def host_busy_ticks() -> int:
    """The host's CPU time not idle since boot (/proc/stat: user nice system irq softirq steal)."""
    f = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    return f[0] + f[1] + f[2] + f[5] + f[6] + f[7]


@dataclass
class Reading:
    t: float
    tree_s: float  # the tree's CPU since boot as the kernel counts it (module docstring)
    host_s: float  # the host's busy CPU since boot
    pids: list[int]


def read_tree(root: int, members: dict[int, int]) -> Reading:
    """The tree now: ``root``'s descendants and every earlier member (``members`` {pid: start
    time}, updated) still alive, since a worker whose parent died is adopted by init and still
    works for the service (Triton's stubs under a loaded host were seen so)."""
    ticks, pids = 0, []
    for p in sorted(set(tree_of(root)) | set(members)):
        st = full_stat(p)
        if st is None or members.setdefault(p, st[3]) != st[3]:  # gone, or its pid reused
            continue
        ticks += st[1] + st[2]
        pids.append(p)
    return Reading(time.time(), ticks / CLK_TCK, host_busy_ticks() / CLK_TCK, pids)


@dataclass
class TreeCPU:
    """The tree of ``root`` read every PERIOD_S on a thread while in the ``with`` block, and once
    on entering and on leaving it (``before``, ``after``)."""

    root: int
    readings: list[Reading] = field(default_factory=list)
    members: dict[int, int] = field(default_factory=dict)  # every process seen in the tree: {pid: start time}

    def __post_init__(self) -> None:
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stopping.wait(PERIOD_S):
            self.readings.append(read_tree(self.root, self.members))

    def __enter__(self) -> TreeCPU:
        self.readings.append(read_tree(self.root, self.members))
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        self._thread.join(timeout=10)
        self.readings.append(read_tree(self.root, self.members))

    @property
    def before(self) -> Reading:
        return self.readings[0]

    @property
    def after(self) -> Reading:
        return self.readings[-1]

    def pids_seen(self) -> set[int]:
        return {p for r in self.readings for p in r.pids}

    def _at(self, t: float, which: str) -> float:
        return float(np.interp(t, [r.t for r in self.readings], [getattr(r, which) for r in self.readings]))

    def seconds(self, t0: float, t1: float) -> float:
        """The tree's CPU seconds between two times (readings interpolated)."""
        return self._at(t1, "tree_s") - self._at(t0, "tree_s")

    def share(self, t0: float, t1: float) -> float | None:
        """The tree's part of the host's busy CPU between two times."""
        busy = self._at(t1, "host_s") - self._at(t0, "host_s")
        return None if busy <= 0 else self.seconds(t0, t1) / busy

    def host_busy_pct(self, t0: float, t1: float) -> float:
        """How busy the host's CPUs were between two times, % of all of them."""
        busy = self._at(t1, "host_s") - self._at(t0, "host_s")
        return 100.0 * busy / ((t1 - t0) * (os.cpu_count() or 1))


def the_host(summary: dict[str, Any]) -> str:
    """The one host of a run that watched a process tree."""
    hosts = [h for h, f in (summary.get("hosts") or {}).items() if isinstance(f, dict) and f.get("tree")]
    assert len(hosts) == 1, summary.get("hosts")
    return hosts[0]


def recorded_cpu_s(run_dir: Path, host: str) -> float:
    """The tree's CPU seconds over the run as the agent recorded it: hosts/HOST/process.csv, the
    service's CPU % (the sum over its processes) at each sample, over the interval before it."""
    proc = pd.read_csv(run_dir / "hosts" / host / "process.csv")
    t, pct = proc["t"].to_numpy(), proc["cpu_pct"].to_numpy()
    return float(np.nansum(pct[1:] / 100.0 * np.diff(t)))


def check_tree_run(run_dir: Path, truth: TreeCPU, workers: dict[int, int]) -> dict[str, Any]:
    """The checks of a real run on a forking server, against the kernel (``truth``) and the
    server's own ``workers`` ({pid: ppid}, found by the test): the tree was watched (scope tree,
    the workers among its processes), its CPU within TREE_CPU_REL of the kernel's over the run and
    over the steps' windows (summary.json), the CPU findings after the knee as the kernel's share
    says, and the report's host section listing every worker.  Returns the run's figures (also
    written beside the run directory, tree-figures.json)."""
    s = json.loads((run_dir / "report" / "summary.json").read_text())
    # complete and without errors; a step may still be invalid (too few requests in its window) on
    # a host others keep busy, and the rules then read only the valid ones, as this check does
    assert s["complete"] is True and all(st["error_rate"] == 0.0 for st in s["steps"]), s.get("warnings")
    host = the_host(s)
    facts = s["hosts"][host]
    assert facts["process"]["scope"] == "tree" and facts["tree"]["scope"] == "tree", facts["process"]
    listed = {p["pid"]: p for p in facts["tree"]["processes"]}
    assert set(workers) <= set(listed), (sorted(workers), sorted(listed))
    # each under the parent the test found, or init's once that parent died (the tree keeps it)
    assert all(listed[w].get("ppid") in (pp, 1) for w, pp in workers.items()), [listed[w] for w in workers]
    assert set(workers) <= truth.pids_seen()

    # the CPU: over the whole run (the kernel read before and after it), and over the steps' windows
    kernel_s, agent_s = truth.after.tree_s - truth.before.tree_s, recorded_cpu_s(run_dir, host)
    steps = [st for st in s["steps"] if st.get("t_lo") is not None and (st.get("server") or {}).get(host)]
    summary_s = sum(st["server"][host]["cpu_pct"] / 100.0 * (st["t_hi"] - st["t_lo"]) for st in steps)
    windows_s = sum(truth.seconds(st["t_lo"], st["t_hi"]) for st in steps)
    assert kernel_s > 1.0 and agent_s == pytest.approx(kernel_s, rel=TREE_CPU_REL), (agent_s, kernel_s)
    assert summary_s == pytest.approx(windows_s, rel=TREE_CPU_REL), (summary_s, windows_s)

    # the findings at and after the knee (without one, the last step), against the kernel's share of the host's busy CPU
    knee = (s.get("knee") or {}).get("users")  # None on a host others filled: QPS may creep up to the end
    confirmed = sorted(f["id"] for f in s["findings"])
    marginal = sorted(f["id"] for f in s.get("findings_marginal") or [])
    valid = [st for st in steps if st.get("valid")]  # the rules' own steps (findings/context.py late)
    late = [st for st in valid if st["users"] >= knee] if knee is not None else valid[-1:]
    windows = {st["users"]: (st["t_lo"], st["t_hi"]) for st in late}
    shares = {u: truth.share(*w) for u, w in windows.items()}
    known = [v for v in shares.values() if v is not None]
    assert known, shares
    figures = {"knee": knee, "interval": (s.get("knee") or {}).get("interval"), "findings": confirmed,
               "findings_marginal": marginal, "causes": (s.get("verdict") or {}).get("causes"),
               "tree_cpu_s": round(agent_s, 2), "kernel_cpu_s": round(kernel_s, 2),
               "diff_pct": round(100.0 * (agent_s - kernel_s) / kernel_s, 2),
               "summary_windows_s": round(summary_s, 2), "kernel_windows_s": round(windows_s, 2),
               "kernel_share_after_knee": {str(k): None if v is None else round(v, 3) for k, v in shares.items()},
               "processes": facts["tree"]["count"], "workers": sorted(workers), "run_dir": str(run_dir)}
    figures["kernel_busy_pct_after_knee"] = {str(u): round(truth.host_busy_pct(*w), 1) for u, w in windows.items()}
    (run_dir.parent / "tree-figures.json").write_text(json.dumps(figures, indent=1))
    steps_of = {f["id"]: set(f.get("steps") or []) for f in [*s["findings"], *(s.get("findings_marginal") or [])]}
    for u, share in shares.items():  # each rule names the steps it fired on: judged step by step
        if share is None:
            continue
        if share >= SERVICE_SHARE:  # the service did most of the busy CPU: not others' work
            assert u not in steps_of.get("host_contended", set()), (u, shares, s["findings"])
        elif share < OTHERS_SHARE:  # others did most of it: not the service's CPU saturated, and if full, said so
            assert u not in steps_of.get("cpu_saturated", set()), (u, shares, s["findings"])
            if truth.host_busy_pct(*windows[u]) >= HOST_FULL_PCT:
                assert u in steps_of.get("host_contended", set()), (u, shares, s["findings"])
    if min(known) >= SERVICE_SHARE:  # the service filled the host at every step after the knee: a CPU cause
        assert CPU_FINDINGS & set(confirmed + marginal), (shares, confirmed, marginal)

    # the report's host section: one line per process, the workers among them
    md, html = (run_dir / "report" / "summary.md").read_text(), (run_dir / "report" / "index.html").read_text()
    for w, pp in workers.items():
        line = f"process {w} (parent "
        assert line in md and line in html, (line, [x for x in md.splitlines() if "process " in x][:20])

    return figures


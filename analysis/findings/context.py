"""What the rules read: a defensive view of a summary dict (as ``analysis.summarize`` returns it).

Keys read (anything missing or malformed reads as "not measured", so a rule does not fire):

* ``steps[]``: ``users``, ``qps``, ``rps``, ``p99_ms``, ``mean_ms``, ``valid``, ``reasons``,
  ``errors`` {category: count}, ``window_s``, ``generator_cpu_max``, ``generator.cpu_pct``
  {worker: %}, ``server[host]`` {metric: mean} with the keys of analysis/measure/serverstats.py
  ``server_metrics``: vmstat ``us sy wa cs r bi bo``; process ``cpu_pct usr_pct sys_pct wait_pct rss_mb threads
  cswch_s nvcswch_s migrations_s sy_share io_read_kb_s io_write_kb_s io_delay_pct``; threads ``active_threads top_thread_cpu_pct``; GPU
  ``sm_pct mem_pct fb_used_mb fb_peak_mb power_w``; and ``target`` {``queue_length rejected_s ...``};
* ``knee.users``; ``analysis.generator_cpu_max``; ``load.loop``;
* ``server[host]`` also ``processes`` (how many processes the service had at once) and ``procs``
  {pid: {``cpu_pct rss_mb threads``}} (each process's own, kneeswarm.analysis.measure.serverstats
  ``tree_metrics``): the figures above are the sums over the service's processes -- the process
  found and its descendants, or its cgroup's --, so every rule that reads "the service" reads them all;
* ``hosts[host].cpu`` {``logical_cpus physical_cores``}, ``hosts[host].process.cmdline``,
  ``hosts[host].tree`` {``processes`` [{pid, name, role, ...}]} (kneeswarm.analysis.measure.hostfacts),
  ``hosts[host].service`` {``cpus bound memory_limit_mb``} (kneeswarm.analysis.measure.hostfacts: the CPUs the
  service may use, from its cgroup's quota and cpuset), and the steps' cgroup metrics
  ``throttled_share cgroup_cpus``.
"""

from __future__ import annotations

from kneeswarm.analysis.schema.summary import (Evidence, HostFacts, LlmWorkload, PlanTable, ProcessGrowth,
                                               SummaryStep, as_dict, num)

import logging
from dataclasses import dataclass, field
from typing import Any, cast

logger = logging.getLogger(__name__)

DEFAULT_GENERATOR_CPU_MAX = 90.0  # kneeswarm/contracts/plan.py AnalysisPlan.generator_cpu_max


def users_text(n: Any) -> str:
    """``n`` users for a finding's text: "1 user", "8 users"."""
    return f"{n} user" if num(n) == 1 else f"{n} users"




def rounded(x: float | None, digits: int = 4) -> float | None:
    """``x`` to ``digits`` significant digits (evidence stays readable in JSON)."""
    if x is None or x == 0:
        return x
    return float(f"{x:.{digits}g}")


def known(step: SummaryStep, key: str) -> float:
    """A figure the Context promises: ``users`` of every step (from_summary keeps no other), and
    ``qps`` of a valid one.  ValueError where that promise was broken (a Context built by hand)."""
    v = num(step.get(key))
    if v is None:
        raise ValueError(f"a findings step without numeric {key!r}: {step!r}")
    return v


def process_growth(steps: list[SummaryStep], host: str, key: str,
                   hosts: dict[str, HostFacts] | None = None) -> ProcessGrowth | None:
    """The service's process whose own ``key`` (``server[host].procs[pid][key]``) rose most from
    the first of ``steps`` it was in to the last: {pid, from, to, rise, name, role} (the last two
    from ``hosts[host].tree`` where it names the pid); None where the steps hold fewer than two
    processes (the service's figure is then that process's)."""
    series: dict[str, list[float]] = {}
    for s in steps:
        procs = as_dict(as_dict(as_dict(s.get("server")).get(host)).get("procs"))
        for pid, figs in procs.items():
            if (v := num(as_dict(figs).get(key))) is not None:
                series.setdefault(str(pid), []).append(v)
    if len(series) < 2:
        return None
    pid, values = max(series.items(), key=lambda kv: (kv[1][-1] - kv[1][0], kv[0]))
    try:
        out: ProcessGrowth = {"pid": int(pid), "from": values[0], "to": values[-1], "rise": values[-1] - values[0]}
    except ValueError:
        return None
    tree = as_dict(as_dict(as_dict(hosts).get(host)).get("tree"))
    known = next((m for m in tree.get("processes") or [] if isinstance(m, dict) and m.get("pid") == out["pid"]), {})
    for k in ("name", "role"):
        if isinstance(v := known.get(k), str) and v:
            out[k] = v
    return out


def process_evidence(grew: ProcessGrowth | None) -> Evidence:
    """A finding's evidence keys for ``process_growth``'s answer: process_pid, process_role,
    process_from, process_to ({} without one)."""
    if not grew:
        return {}
    return {"process_pid": grew["pid"], "process_role": grew.get("role"), "process_from": grew["from"],
            "process_to": grew["to"]}


def process_text(grew: ProcessGrowth | None, unit: str = "") -> str:
    """"; most in process 4505 (worker), 30 -> 1,230 MB" for ``process_growth``'s answer ("" without one)."""
    if not grew:
        return ""
    who = f"process {grew['pid']}" + (f" ({grew['role']})" if grew.get("role") else "")
    return f"; most in {who}, {grew['from']:,.0f} -> {grew['to']:,.0f}{unit}"


@dataclass
class Context:
    """The steps sorted by users, the knee, the host facts and the plan, read once."""

    steps: list[SummaryStep]
    knee_users: float | None
    hosts: dict[str, HostFacts]
    plan: PlanTable
    generator_cpu_max: float
    loop: str = "closed"  # summary["load"]["loop"] (analysis/measure/loop.py): "closed" unless it says "open"
    llm_workload: LlmWorkload = field(default_factory=lambda: LlmWorkload())  # summary["llm_workload"] (analysis/measure/llmworkload.py)
    valid: list[SummaryStep] = field(init=False)  # the steps marked valid with numeric users and QPS

    def __post_init__(self) -> None:
        self.valid = [s for s in self.steps if s.get("valid") is True and num(s.get("qps")) is not None
                      and num(s.get("users")) is not None]

    @classmethod
    def from_summary(cls, summary: Any, plan: Any = None) -> Context:
        summary = as_dict(summary)
        if hasattr(plan, "to_dict"):  # a kneeswarm.contracts.plan.Plan rather than its dict
            plan = plan.to_dict()
        raw = summary.get("steps") if isinstance(summary.get("steps"), list) else []
        by_users = [(u, cast(SummaryStep, s)) for s in raw if isinstance(s, dict) and (u := num(s.get("users"))) is not None]
        steps = [s for _, s in sorted(by_users, key=lambda us: us[0])]
        knee = num(as_dict(summary.get("knee")).get("users"))
        gmax = num(as_dict(summary.get("analysis")).get("generator_cpu_max"))
        hosts = {str(h): cast(HostFacts, as_dict(f)) for h, f in as_dict(summary.get("hosts")).items()}
        loop = "open" if as_dict(summary.get("load")).get("loop") == "open" else "closed"
        return cls(steps=steps, knee_users=knee, hosts=hosts, plan=as_dict(plan),
                   generator_cpu_max=DEFAULT_GENERATOR_CPU_MAX if gmax is None else gmax, loop=loop,
                   llm_workload=cast(LlmWorkload, as_dict(summary.get("llm_workload"))))

    # -- steps ---------------------------------------------------------------------------------
    def knee_step(self) -> SummaryStep | None:
        """The valid step at the knee (None when no knee was found)."""
        if self.knee_users is None:
            return None
        return next((s for s in self.valid if num(s.get("users")) == self.knee_users), None)

    def late(self) -> list[SummaryStep]:
        """The valid steps at or after the knee; without a knee, the last valid step alone
        (the highest load tested: where a resource limit would show first)."""
        knee = self.knee_users
        if knee is None:
            return self.valid[-1:]
        return [s for s in self.valid if known(s, "users") >= knee]

    def before_knee(self) -> SummaryStep | None:
        """The valid step just before the knee (the knee step itself when it is the first)."""
        ks, knee = self.knee_step(), self.knee_users
        if ks is None or knee is None:
            return None
        earlier = [s for s in self.valid if known(s, "users") < knee]
        return earlier[-1] if earlier else ks

    # -- metrics -------------------------------------------------------------------------------
    def server_hosts(self) -> list[str]:
        """Hosts with server metrics in at least one step, in name order."""
        return sorted({str(h) for s in self.steps for h in as_dict(s.get("server"))})

    @staticmethod
    def metric(step: SummaryStep, host: str, key: str) -> float | None:
        """step["server"][host][key] ("target.x" reads the target's /metrics dict)."""
        m = as_dict(as_dict(step.get("server")).get(host))
        if key.startswith("target."):
            return num(as_dict(m.get("target")).get(key[len("target."):]))
        return num(m.get(key))

    @classmethod
    def metric_at_each(cls, steps: list[SummaryStep], host: str, key: str) -> list[float] | None:
        """:meth:`metric` at each of ``steps``; None when any of them did not measure it."""
        values = [cls.metric(s, host, key) for s in steps]
        measured = [v for v in values if v is not None]
        return measured if len(measured) == len(values) else None

    def cpu_fact(self, host: str, key: str) -> float | None:
        """hosts[host]["cpu"][key] (``logical_cpus``, ``physical_cores``), if positive."""
        v = num(as_dict(as_dict(self.hosts.get(host)).get("cpu")).get(key))
        return v if v is not None and v > 0 else None

    def service_cpus(self, host: str) -> float | None:
        """The CPUs the service on ``host`` may use: hosts[host]["service"]["cpus"] (the smallest of
        its cgroup's CPU quota, its cpuset and the host's logical CPUs: kneeswarm.analysis.measure.hostfacts), else
        the host's logical CPUs; None when neither is known."""
        v = num(as_dict(as_dict(self.hosts.get(host)).get("service")).get("cpus"))
        return v if v is not None and v > 0 else self.cpu_fact(host, "logical_cpus")

    def service_cpus_bound(self, host: str) -> str:
        """What bounds ``service_cpus``: "quota", "cpuset" or "host"."""
        service = as_dict(as_dict(self.hosts.get(host)).get("service"))
        bound = service.get("bound")
        return bound if bound in ("quota", "cpuset") and num(service.get("cpus")) is not None else "host"

    def processes(self, step: SummaryStep, host: str) -> float | None:
        """How many processes the service had at once in ``step`` (None: a run from before the tree)."""
        return self.metric(step, host, "processes")

    def process_share(self, step: SummaryStep, host: str) -> float | None:
        """The monitored service's part of the host's busy CPU (0..1: the CPU of all its processes,
        the work outside it is the rest), None when either is unknown.

        A service bounded by its cgroup (a quota or cpuset below the host's CPUs) has CPUs of its
        own: its share is then of those (``service_busy``), since others' work on the rest of the
        host is not what kept it from its limit."""
        if self.service_cpus_bound(host) != "host":
            busy = self.service_busy(step, host)
            return None if busy is None else min(busy / 100.0, 1.0)
        proc, cpus, busy = self.metric(step, host, "cpu_pct"), self.cpu_fact(host, "logical_cpus"), self.host_busy(step, host)
        if proc is None or cpus is None or busy is None or busy <= 0:
            return None
        return min(proc / cpus / busy, 1.0)

    def cpu_wait_share(self, step: SummaryStep, host: str) -> float | None:
        """The share of the requests' time in flight that the process's threads spent waiting for a
        CPU: its run delay (pidstat %wait summed over threads, CPU-seconds per second) over the
        request-seconds in flight per second (throughput x mean latency, = the users in a closed
        loop).  None when either is not measured."""
        return self.share_of_time_in_flight(step, host, "wait_pct")

    def share_of_time_in_flight(self, step: SummaryStep, host: str, column: str) -> float | None:
        """A per-thread delay ``column`` of the process (percent: CPU-seconds per second summed over
        threads) over the request-seconds in flight per second (throughput, the rps or else the
        qps, x mean latency).  None when either is not measured."""
        delay = self.metric(step, host, column)
        x, r = num(step.get("rps")), num(step.get("mean_ms"))
        x = x if x is not None else num(step.get("qps"))
        if delay is None or x is None or r is None or x * r <= 0:
            return None
        return (delay / 100.0) / (x * r / 1000.0)

    def io_share(self, step: SummaryStep, host: str) -> float | None:
        """The monitored process's part of the host's disk traffic (0..1): its kB read + written
        per second (pidstat -d) over vmstat's bi + bo (KiB/s); 1 when the host's counters show none
        but the process did IO, 0 when the process did none.  None when the process's IO was not
        recorded (a run directory from before it was, or the procfs sampler)."""
        rd, wr = self.metric(step, host, "io_read_kb_s"), self.metric(step, host, "io_write_kb_s")
        if rd is None or wr is None:
            return None
        own = rd + wr
        if own <= 0:
            return 0.0
        bi, bo = self.metric(step, host, "bi"), self.metric(step, host, "bo")
        total = (bi or 0.0) + (bo or 0.0)
        return 1.0 if total <= 0 else min(own / total, 1.0)

    def io_delay_share(self, step: SummaryStep, host: str) -> float | None:
        """The share of the requests' time in flight that the process's threads spent blocked on
        disk IO (pidstat iodelay summed over threads, over throughput x mean latency, as
        ``cpu_wait_share``); None when not measured.  Reads 0 where the kernel's delay accounting
        is off (kernel.task_delayacct): never a reason to fire on its own there."""
        return self.share_of_time_in_flight(step, host, "io_delay_pct")

    def host_busy(self, step: SummaryStep, host: str) -> float | None:
        """Host CPU us + sy (vmstat), percent of all CPUs."""
        us, sy = self.metric(step, host, "us"), self.metric(step, host, "sy")
        return None if us is None or sy is None else us + sy

    def service_busy(self, step: SummaryStep, host: str) -> float | None:
        """How busy the CPUs the service may use were, percent: the host's us + sy where the host
        bounds the service; under a cgroup quota or cpuset, the cgroup's CPU use (else the
        process's) over ``service_cpus``; under a quota, at least the throttled share of its
        periods, since a period is throttled only once its quota is spent.  (Measured: the demo
        target under half a CPU, throttled in 100 % of its periods, read 42.75 % CPU in pidstat,
        86 % of the quota: the sampled use falls short of what the throttling says was used.)"""
        bound = self.service_cpus_bound(host)
        if bound == "host":
            return self.host_busy(step, host)
        used = self.metric(step, host, "cgroup_cpus")
        if used is None:
            proc = self.metric(step, host, "cpu_pct")
            used = None if proc is None else proc / 100.0
        cpus = self.service_cpus(host)
        busy = None if used is None or cpus is None else 100.0 * used / cpus
        throttled = self.metric(step, host, "throttled_share") if bound == "quota" else None
        if throttled is not None:
            busy = max(busy or 0.0, 100.0 * throttled)
        return busy

"""CPU rules: saturation, the run queue, threads against cores, one hot thread, kernel time,
context switches, migrations, iowait.  Each looks at the steps at or after the knee
(``Context.late``) on every host with server metrics, and returns one finding per host.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from kneeswarm.analysis.findings.context import Context, known, users_text
from kneeswarm.analysis.findings.finding import finding
from kneeswarm.analysis.schema.summary import Finding, SummaryStep

logger = logging.getLogger(__name__)

CPU_SATURATED_PCT = 90.0  # specified, no published figure: host us + sy >= 90 %
RUN_QUEUE_PER_CPU = 1.0  # digest: vmstat r persistently above the logical CPUs => overloaded
# vmstat's r is procs_running at the sampling instant and counts the vmstat process itself
# (REFERENCE.md, "Containers"): one runnable task of every sample is the sampler.
VMSTAT_SELF = 1.0
# A run queue longer than the CPUs cannot persist while CPUs sit idle (this rule once fired on r 2.2
# on 2 CPUs with the host 90 % idle).  The excess is read only in a step whose CPUs were full, as
# cpu_saturated reads "full"; an instantaneous r above the CPUs on an idle host is a sampling blip.
RUN_QUEUE_BUSY_PCT = CPU_SATURATED_PCT
SINGLE_THREAD_PCT = 90.0  # specified, no published figure: the busiest thread at >= 90 % of one core
# "while the host has idle CPU": at least half a CPU's worth idle (on 2 CPUs: 25 % idle).  One
# pinned thread on a 2-CPU host leaves ~50 % idle; a saturated host leaves none.
SINGLE_THREAD_IDLE_CPUS = 0.5
# Busy threads beyond the physical cores compete only when the cores are full: 64 threads at 10 %
# each on 32 cores have the cores to themselves.  Full: the host's CPUs (cpu_saturated's "full",
# with the service's part of it), or the process alone using this share of the physical cores'
# time (a 2-way SMT host is only half busy when every physical core runs one thread).
THREADS_FILL_PCT = CPU_SATURATED_PCT
KERNEL_SHARE = 0.10  # digest: %sy above 10 % of the CPU time => lock contention / switching
# The kernel share is read only where the CPU does real work: a near-idle process that spends its
# few cycles in socket syscalls is not "contended".  The host share is used only when the process
# was not measured, because on a host shared with the load generator its network syscalls inflate
# it (measured: demo target on this 2-core machine, host sy share 23 % at 1 user while the
# process's own share was 4 %).
KERNEL_MIN_PROCESS_CPU_PCT = 50.0
KERNEL_MIN_HOST_BUSY_PCT = 50.0
SWITCH_STORM_GROWTH = 3.0  # specified: cs/s grew >= 3x from the step before the knee to the last
# ... and faster than the work: cs/s per request at least doubled (cs/s rising with QPS is normal;
# the article's storm was 4x the switches at 32 threads for less throughput than at 16)
SWITCH_PER_REQUEST_GROWTH = 2.0
SWITCH_STORM_MIN_PER_S = 1000.0  # below this, switching costs nothing worth reporting
# The method (DIGEST.md, "lost cache affinity") names no figure: "many migration events in `perf
# sched`".  The figure here is the kernel's own price of a migration: sched_migration_cost_ns,
# 0.5 ms by default (kernel/sched/fair.c, sysctl_sched_migration_cost: a task that ran within it
# is cache-hot and the load balancer leaves it where it is).  At this many migrations per second
# of CPU the process used, its threads spend about 100 x 0.5 ms = 5 % of their CPU time warming
# caches again (the article's pinning gained 12 % QPS).  Per CPU-second, not per second, since a
# process that computes on 32 cores migrates more than one computing on 1 for the same harm.
# Measured here with the kernel's counters (se.nr_migrations, on 2 CPUs shared with other
# work): 1-2 busy threads 0-5 per CPU-second, 4-8 busy Python threads (more than the CPUs) 60-75,
# the ONNX demo target (2 request threads) at 1-2 users left to the scheduler 3-49, the same
# with its threads moved to the other CPU every 4 ms 250-620
# (tests/test_findings_real.py::test_threads_moved_between_cpus_are_migrations_high_by_the_kernels_count).
MIGRATIONS_PER_CPU_S = 100.0
# The migrations counted before the kernel's counter was read (pidstat; /proc without a sched
# file) are at most one per thread per sample: a lower bound, read against the same figure.
MIGRATIONS_MIN_PROCESS_CPU_PCT = KERNEL_MIN_PROCESS_CPU_PCT
IO_WAIT_PCT = 10.0  # specified, no published figure: iowait > 10 %
# ... and that wait is the service's only where it did a fair part of the disk traffic (its own
# kB read + written, pidstat -d, over vmstat bi + bo): the same fair part as the CPU's
# (PROCESS_SHARE_MIN).  Measured (the false alarm it prevents): the knee-mode target, which does no disk IO, got
# io_wait at wa 29 % from the disk writes of the runs beside it on this shared machine.
IO_SHARE_MIN = 0.25
# vmstat's wa counts only idle CPU time (a CPU kept busy by others shows 0 % wa whatever waits on
# the disk: measured here, 31 MB/s of fsync'd writes at wa 0 with the CPUs full).  The service's
# own threads blocked on disk (pidstat iodelay, where kernel.task_delayacct is on) count without
# it: at least this share of its requests' time in flight, the figure of CPU_WAIT_DISTURBS.
IO_DELAY_DISTURBS = 0.10
# A full host is the service's doing only when the monitored process did a fair part of the work.
# Measured: the knee-mode demo target on this shared 2-CPU machine used 4 % of the CPUs while other
# processes kept the host 77 % busy with a run queue of 2.7; that is host_contended, not the service.
# (The run queue is also blamed on a process whose own threads wanted more CPUs than there are,
# whatever its CPU share: the 8 x 2-thread demo target got only 18 % of a host that others kept
# full, with r = 15.5.  Its own demand is measured, not guessed from its thread count: pidstat's
# %CPU + %wait, summed over its threads, is the average number of them running or waiting for a
# CPU (schedstat run time + run delay).  Measured here on a host others kept full: the 7-thread
# ONNX target at 2 users, 41 % CPU, 4 threads active, r = 9.8.)
PROCESS_SHARE_MIN = 0.25
# "The CPU is the bottleneck" (cpu_saturated) says more: that the service filled it.  That holds
# only where it did most of the busy CPU; a fair part is not enough (it once blamed a service
# that did 25-35 % of a host other processes filled).  Below it, a full host on which the service
# waited for a CPU is host_contended.  The figure: a majority, no published threshold.
SATURATED_SHARE_MIN = 0.5
# ... and disturbs the service only when its threads waited for a CPU: at least this share of its
# requests' time in flight (Context.cpu_wait_share; not measured: assumed disturbed).  No published
# figure: the 10 % within which Little's law holds a step's numbers to be the same.  Measured here:
# the knee-mode target on a host others kept 100 % busy (r 8.5-10.4) waited 0.4-5 % of it.
CPU_WAIT_DISTURBS = 0.10


def _per_host(ctx: Context, check: Callable[[Context, str], Finding | None]) -> list[Finding]:
    return [f for h in ctx.server_hosts() if (f := check(ctx, h)) is not None]


def _worst(steps: list[SummaryStep], value: Callable[[SummaryStep], float | None],
           fires: Callable[[float], bool]) -> tuple[list[SummaryStep], SummaryStep | None, float | None]:
    """(steps where value fires, the step with the largest value among them, that value)."""
    hits = [(s, v) for s in steps if (v := value(s)) is not None and fires(v)]
    if not hits:
        return [], None, None
    step, v = max(hits, key=lambda sv: sv[1])
    return [s for s, _ in hits], step, v


def by_service(c: Context, s: SummaryStep, h: str) -> bool:
    """False when the monitored process is measured and did under PROCESS_SHARE_MIN of the host's work."""
    share = c.process_share(s, h)
    return share is None or share >= PROCESS_SHARE_MIN


def service_demand(c: Context, s: SummaryStep, h: str) -> float | None:
    """The process's threads running or waiting for a CPU, on average: (%CPU + %wait) / 100."""
    cpu, wait = c.metric(s, h, "cpu_pct"), c.metric(s, h, "wait_pct")
    return None if cpu is None or wait is None else (cpu + wait) / 100.0


def fills_cpu(c: Context, s: SummaryStep, h: str) -> bool:
    """False when the monitored process is measured and did under SATURATED_SHARE_MIN of the busy CPU."""
    share = c.process_share(s, h)
    return share is None or share >= SATURATED_SHARE_MIN


def cpu_full_by_service(c: Context, s: SummaryStep, h: str) -> bool:
    """The CPUs the service may use were full (Context.service_busy >= CPU_SATURATED_PCT) and the
    service did most of that work (``fills_cpu``, SATURATED_SHARE_MIN): cpu_saturated's "full",
    read by every rule that needs "the CPU was full with the service's own work"
    (scaling.latency_swinging)."""
    busy = c.service_busy(s, h)
    return busy is not None and busy >= CPU_SATURATED_PCT and fills_cpu(c, s, h)


def _may_fill_queue(c: Context, s: SummaryStep, h: str) -> bool:
    """The process did a fair part of the work, or its own threads wanted more than the CPUs."""
    demand, cpus = service_demand(c, s, h), c.service_cpus(h)
    return by_service(c, s, h) or (demand is not None and cpus is not None and demand > cpus * RUN_QUEUE_PER_CPU)


def _host_full(c: Context, s: SummaryStep, h: str) -> bool:
    """The CPUs were full (a run queue above the CPUs counts only then: ``runnable``)."""
    busy = c.host_busy(s, h)
    return busy is not None and busy >= CPU_SATURATED_PCT


def cpu_starved(c: Context, s: SummaryStep, h: str) -> bool:
    """The service's threads waited for a CPU CPU_WAIT_DISTURBS of their requests' time, or that
    wait was not measured."""
    share = c.cpu_wait_share(s, h)
    return share is None or share >= CPU_WAIT_DISTURBS


def runnable(c: Context, s: SummaryStep, h: str) -> float | None:
    """Tasks that wanted a CPU besides the sampler (vmstat r - VMSTAT_SELF), read only in a step
    whose CPUs were full (RUN_QUEUE_BUSY_PCT); None otherwise or when not measured.

    A service bounded by its cgroup (Context.service_cpus_bound) has CPUs of its own, and the
    host's run queue counts every other tenant's tasks: there, its own threads running or waiting
    (``service_demand``, throttled time included) when its CPUs were full (``service_busy``)."""
    if c.service_cpus_bound(h) != "host":
        demand, busy = service_demand(c, s, h), c.service_busy(s, h)
        return demand if demand is not None and busy is not None and busy >= RUN_QUEUE_BUSY_PCT else None
    r, busy = c.metric(s, h, "r"), c.host_busy(s, h)
    if r is None or busy is None or busy < RUN_QUEUE_BUSY_PCT:
        return None
    return max(r - VMSTAT_SELF, 0.0)


def cpu_saturated(ctx: Context) -> list[Finding]:
    def check(c: Context, h: str) -> Finding | None:
        hits, worst, busy = _worst(c.late(), lambda s: c.service_busy(s, h) if cpu_full_by_service(c, s, h) else None,
                                   lambda v: True)
        if worst is None:
            return None
        us, sy, cpus = c.metric(worst, h, "us"), c.metric(worst, h, "sy"), c.service_cpus(h)
        of = f"us {us:.0f} + sy {sy:.0f}" if c.service_cpus_bound(h) == "host" and us is not None and sy is not None \
            else f"of the {cpus:g} CPUs the service may use"
        return finding("cpu_saturated", hits, {"host": h, "users": worst["users"], "us": us, "sy": sy,
                                               "busy_pct": busy, "threshold_pct": CPU_SATURATED_PCT,
                                               "process_share": c.process_share(worst, h),
                                               "share_min": SATURATED_SHARE_MIN,
                                               "service_cpus": cpus, "cpus_bound": c.service_cpus_bound(h)},
                       f"{h}: CPU {busy:.0f}% busy ({of}) at {users_text(worst['users'])}: "
                       "the CPU is the bottleneck.",
                       "Read the other findings for what the CPU was spent on; then add cores or replicas, "
                       "or cut the work per request (batching, a smaller model, fewer engine threads).")
    return _per_host(ctx, check)


def run_queue_over_cores(ctx: Context) -> list[Finding]:
    def check(c: Context, h: str) -> Finding | None:
        cpus = c.service_cpus(h)
        if cpus is None:
            return None
        limit = cpus * RUN_QUEUE_PER_CPU
        hits, worst, queue = _worst(c.late(), lambda s: runnable(c, s, h) if _may_fill_queue(c, s, h) else None,
                                    lambda v: v > limit)
        if worst is None:
            return None
        return finding("run_queue_over_cores", hits, {"host": h, "users": worst["users"], "r": c.metric(worst, h, "r"),
                                                      "runnable": queue, "busy_pct": c.service_busy(worst, h),
                                                      "logical_cpus": c.cpu_fact(h, "logical_cpus"),
                                                      "service_cpus": cpus, "cpus_bound": c.service_cpus_bound(h),
                                                      "threads": c.metric(worst, h, "threads"),
                                                      "service_demand": service_demand(c, worst, h),
                                                      "process_share": c.process_share(worst, h)},
                       (f"{h}: {queue:.1f} tasks wanted the {cpus:.0f} logical CPUs (run queue, the sampler counted out) "
                        if c.service_cpus_bound(h) == "host" else
                        f"{h}: {queue:.1f} of the service's threads wanted the {cpus:g} CPUs it may use (running or "
                        "waiting, throttled time included) ")
                       + f"while they were {c.service_busy(worst, h):.0f}% busy at {users_text(worst['users'])}: more threads "
                       "want to run than there are CPUs, so more threads only lengthen the queue.",
                       "Cut the runnable threads to about the number of cores: fewer request threads, or "
                       "intra_op_num_threads 2-4 and inter_op_num_threads 1 with many concurrent requests.")
    return _per_host(ctx, check)


def host_contended(ctx: Context) -> list[Finding]:
    """The host was full (CPU >= 90 %) but mostly with other processes' work (the service did under
    SATURATED_SHARE_MIN of it), and the service's threads waited for a CPU (``cpu_starved``): its
    numbers may be disturbed.  Not a diagnosis of the service."""
    def check(c: Context, h: str) -> Finding | None:
        def others(s: SummaryStep) -> float | None:  # the other processes' part of the busy CPU
            share = c.process_share(s, h)  # not measured: fills_cpu holds, so the step is not one
            if share is None or fills_cpu(c, s, h) or not _host_full(c, s, h) or not cpu_starved(c, s, h):
                return None
            return 1.0 - share

        hits, worst, rest = _worst(c.late(), others, lambda v: True)
        if worst is None or rest is None:  # no step fired (_worst gives a value with every step)
            return None
        busy, r, n = c.host_busy(worst, h), c.metric(worst, h, "r"), c.processes(worst, h)
        who = "the monitored process" if n is None else (
            "the monitored service" + (f" (its {n:.0f} processes)" if n >= 1.5 else " (one process)"))
        return finding("host_contended", hits, {"host": h, "users": worst["users"], "busy_pct": busy, "r": r,
                                                "logical_cpus": c.cpu_fact(h, "logical_cpus"),
                                                "process_share": 1.0 - rest, "threshold": SATURATED_SHARE_MIN,
                                                "cpu_wait_share": c.cpu_wait_share(worst, h), "processes": n},
                       f"{h}: the host was full (CPU {busy:.0f}%" + (f", run queue {r:.1f}" if r is not None else "") + f") at {users_text(worst['users'])}, but "
                       f"{who} did only {1.0 - rest:.0%} of that work: processes outside it competed for "
                       "the CPUs, so the service's numbers may be disturbed.",
                       "Run the load test on a quiet host (or the load generator elsewhere) and rerun.")
    return _per_host(ctx, check)


def fills_cores(c: Context, s: SummaryStep, h: str, cores: float) -> bool:
    """The host's CPUs were full and the process did a fair part of it (PROCESS_SHARE_MIN: on a host
    others fill, its threads compete with theirs, not with each other), or the process alone used
    THREADS_FILL_PCT of the physical cores' time."""
    proc = c.metric(s, h, "cpu_pct")
    return (_host_full(c, s, h) and by_service(c, s, h)) or (proc is not None and proc >= THREADS_FILL_PCT * cores)


def threads_over_cores(ctx: Context) -> list[Finding]:
    def check(c: Context, h: str) -> Finding | None:
        cores = c.cpu_fact(h, "physical_cores")
        if cores is None:
            return None
        def value(s: SummaryStep) -> float | None:
            return c.metric(s, h, "active_threads") if fills_cores(c, s, h, cores) else None

        hits, worst, n = _worst(c.late(), value, lambda v: v > cores)
        if worst is None:
            return None
        return finding("threads_over_cores", hits, {"host": h, "users": worst["users"], "active_threads": n,
                                                    "physical_cores": cores, "cpu_pct": c.metric(worst, h, "cpu_pct")},
                       f"{h}: {n:.1f} threads busy on {cores:.0f} physical cores at {users_text(worst['users'])}.",
                       "Keep busy compute threads at or below the physical cores: hyper-threads add 10-30% "
                       "at best for pure compute; size the request pool x engine threads to the cores.")
    return _per_host(ctx, check)


def _idle_cpus(c: Context, s: SummaryStep, h: str) -> float | None:
    """CPUs' worth of idle time of the CPUs the service may use: from vmstat (from the cgroup's or
    process's CPU where a quota or cpuset bounds it: Context.service_busy), else from the process's."""
    cpus = c.service_cpus(h)
    if cpus is None:
        return None
    busy = c.service_busy(s, h)
    if busy is not None:
        return cpus * (100.0 - busy) / 100.0
    proc = c.metric(s, h, "cpu_pct")
    return None if proc is None else cpus - proc / 100.0


def single_thread_bound(ctx: Context) -> list[Finding]:
    def check(c: Context, h: str) -> Finding | None:
        def value(s: SummaryStep) -> float | None:
            top, idle = c.metric(s, h, "top_thread_cpu_pct"), _idle_cpus(c, s, h)
            return top if top is not None and idle is not None and idle >= SINGLE_THREAD_IDLE_CPUS else None

        hits, worst, top = _worst(c.late(), value, lambda v: v >= SINGLE_THREAD_PCT)
        if worst is None:
            return None
        idle = _idle_cpus(c, worst, h)
        return finding("single_thread_bound", hits, {"host": h, "users": worst["users"], "top_thread_cpu_pct": top,
                                                     "idle_cpus": idle, "logical_cpus": c.cpu_fact(h, "logical_cpus"),
                                                     "service_cpus": c.service_cpus(h)},
                       f"{h}: the busiest thread ran at {top:.0f}% of a core while {idle:.1f} CPUs sat idle at "
                       f"{users_text(worst['users'])}: one thread is the serial section.",
                       "Find that thread (pidstat -t): a Python GIL, an event loop doing the inference, one "
                       "engine thread or a lock. Run inference outside the loop, use processes instead of "
                       "threads, or raise the engine's intra-op threads.")
    return _per_host(ctx, check)


def _kernel_share(c: Context, s: SummaryStep, h: str) -> tuple[str, float] | None:
    """("process"|"host", sy share) where the CPU did real work, else None."""
    proc_cpu, share = c.metric(s, h, "cpu_pct"), c.metric(s, h, "sy_share")
    if proc_cpu is not None or share is not None:  # the process was measured: its share or none
        if proc_cpu is None or share is None or proc_cpu < KERNEL_MIN_PROCESS_CPU_PCT:
            return None
        return "process", share
    busy, sy = c.host_busy(s, h), c.metric(s, h, "sy")
    if busy is None or sy is None or busy < KERNEL_MIN_HOST_BUSY_PCT:
        return None
    return "host", sy / busy


def kernel_time_high(ctx: Context) -> list[Finding]:
    def check(c: Context, h: str) -> Finding | None:
        def value(s: SummaryStep) -> float | None:
            ks = _kernel_share(c, s, h)
            return None if ks is None else ks[1]

        hits, worst, share = _worst(c.late(), value, lambda v: v > KERNEL_SHARE)
        # the worst step fired, so its _kernel_share was not None: the checks only narrow the types
        if worst is None or share is None or (ks := _kernel_share(c, worst, h)) is None:
            return None
        where = ks[0]
        return finding("kernel_time_high", hits, {"host": h, "users": worst["users"], "of": where,
                                                  "sy_share": share, "sy": c.metric(worst, h, "sy"),
                                                  "sys_pct": c.metric(worst, h, "sys_pct"),
                                                  "threshold": KERNEL_SHARE},
                       f"{h}: {share:.0%} of the {where}'s CPU time was in the kernel at {users_text(worst['users'])}: "
                       "lock contention or context switching is out of control.",
                       "Fewer threads than cores, a lock-free or sharded hot path, and pinned threads "
                       "(taskset, sched_setaffinity, GOMP_CPU_AFFINITY).")
    return _per_host(ctx, check)


def _switches(c: Context, s: SummaryStep, h: str) -> float | None:
    """Context switches/s: the process's own (voluntary + involuntary, summed over its threads)
    where measured, else the host's (vmstat cs).  On a host shared with the load generator and
    other work the host's count is theirs too (so the service's own signal is read first)."""
    v, nv = c.metric(s, h, "cswch_s"), c.metric(s, h, "nvcswch_s")
    if v is not None and nv is not None:
        return v + nv
    return c.metric(s, h, "cs")


def switch_storm(ctx: Context) -> list[Finding]:
    def check(c: Context, h: str) -> Finding | None:
        base, last = c.before_knee(), (c.valid[-1] if c.valid else None)
        # both are valid steps: their users and qps are numbers (Context.valid, ``known``)
        if base is None or last is None or known(last, "users") <= known(base, "users"):
            return None
        cs0, cs1 = _switches(c, base, h), _switches(c, last, h)
        q0, q1 = known(base, "qps"), known(last, "qps")
        if cs0 is None or cs1 is None:
            return None  # switches not measured at both steps
        if cs0 <= 0 or q0 <= 0 or q1 <= 0 or cs1 < SWITCH_STORM_MIN_PER_S:
            return None
        growth, work = cs1 / cs0, q1 / q0
        if growth < SWITCH_STORM_GROWTH or growth / work < SWITCH_PER_REQUEST_GROWTH:
            return None
        return finding("switch_storm", [base, last], {"host": h, "from_users": base["users"], "to_users": last["users"],
                                                      "cs_from": cs0, "cs_to": cs1, "growth": growth,
                                                      "qps_growth": work},
                       f"{h}: context switches rose {growth:.1f}x ({cs0:,.0f} -> {cs1:,.0f}/s) from {base['users']} to "
                       f"{users_text(last['users'])} while QPS changed {work:.2f}x: threads are fighting for the CPUs.",
                       "Fewer threads (request pool x engine threads <= cores), pin them to cores, and check "
                       "migrations with `perf sched`.")
    return _per_host(ctx, check)


def migrations_high(ctx: Context) -> list[Finding]:
    def check(c: Context, h: str) -> Finding | None:
        def value(s: SummaryStep) -> float | None:
            """Migrations per second of CPU the process used, where it computed."""
            proc, m = c.metric(s, h, "cpu_pct"), c.metric(s, h, "migrations_s")
            if proc is None or m is None or proc < MIGRATIONS_MIN_PROCESS_CPU_PCT:
                return None
            return m / (proc / 100.0)

        hits, worst, per_cpu = _worst(c.late(), value, lambda v: v >= MIGRATIONS_PER_CPU_S)
        if worst is None:
            return None
        m, proc = c.metric(worst, h, "migrations_s"), c.metric(worst, h, "cpu_pct")
        return finding("migrations_high", hits, {"host": h, "users": worst["users"], "migrations_s": m,
                                                 "cpu_pct": proc, "per_cpu_s": per_cpu,
                                                 "threshold_per_cpu_s": MIGRATIONS_PER_CPU_S},
                       f"{h}: {m:,.0f} thread migrations/s at {users_text(worst['users'])}, {per_cpu:,.0f} per "
                       f"second of CPU the service used ({proc:.0f} % CPU): threads keep moving between CPUs and "
                       "lose their warm caches.",
                       "Pin the inference threads (taskset, sched_setaffinity, GOMP_CPU_AFFINITY / "
                       "OMP_PROC_BIND); the article measured P99 173 -> 121 ms and +12% QPS from pinning.")
    return _per_host(ctx, check)


def _io_fires(c: Context, s: SummaryStep, h: str) -> bool:
    """The host waited on IO (wa > IO_WAIT_PCT) and the service did its part of the disk traffic
    (IO_SHARE_MIN; not recorded: the host's wa alone), or the service's own threads were blocked
    on disk IO_DELAY_DISTURBS of its requests' time (measured where delay accounting is on)."""
    wa, share, delay = c.metric(s, h, "wa"), c.io_share(s, h), c.io_delay_share(s, h)
    by_host = wa is not None and wa > IO_WAIT_PCT and (share is None or share >= IO_SHARE_MIN)
    return by_host or (delay is not None and delay >= IO_DELAY_DISTURBS)


def io_wait(ctx: Context) -> list[Finding]:
    def check(c: Context, h: str) -> Finding | None:
        def value(s: SummaryStep) -> float | None:
            return max(c.metric(s, h, "wa") or 0.0, 100.0 * (c.io_delay_share(s, h) or 0.0)) \
                if _io_fires(c, s, h) else None

        hits, worst, _ = _worst(c.late(), value, lambda v: True)
        if worst is None:
            return None
        wa, share, delay = c.metric(worst, h, "wa"), c.io_share(worst, h), c.io_delay_share(worst, h)
        # io_share is not None exactly when both are measured (Context.io_share), so kb is then too
        rd, wr = c.metric(worst, h, "io_read_kb_s"), c.metric(worst, h, "io_write_kb_s")
        kb = None if rd is None or wr is None else rd + wr
        own = ("the service's own disk IO was not recorded (a run from before pidstat -d or the procfs sampler's "
               "IO, or no permission to read /proc/PID/io): this is the host's wait, which other processes' IO may cause"
               if share is None else
               f"the service did {share:.0%} of the host's disk traffic ({kb:,.0f} KiB/s)"
               + (f", its threads blocked on disk {min(delay, 1.0):.0%} of its requests' time" if delay else ""))
        return finding("io_wait", hits, {"host": h, "users": worst["users"], "wa": wa, "threshold_pct": IO_WAIT_PCT,
                                         "service_io_kb_s": kb, "io_share": share, "io_share_min": IO_SHARE_MIN,
                                         "io_delay_share": delay, "io_delay_threshold": IO_DELAY_DISTURBS,
                                         "service_io_recorded": share is not None},
                       f"{h}: {wa or 0:.0f}% of CPU time waiting on IO at {users_text(worst['users'])} and {own}: "
                       "IO is dragging.",
                       "Find the IO (iotop, pidstat -d): model or data loads per request, logging, swap; keep "
                       "the model in memory and log asynchronously.")
    return _per_host(ctx, check)

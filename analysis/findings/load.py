"""Load-curve rules: a retrograde curve, a generator that was the bottleneck, a queue that pushes
back (healthy) or never does (latency explodes), and the residual diagnosis: the CPU was not
full, no other cause was found, yet latency rose — the engine waits on something."""

from __future__ import annotations

import logging
from typing import Any

from kneeswarm.analysis.findings.context import Context, as_dict, known, users_text
from kneeswarm.analysis.schema.summary import Finding, SummaryStep, num
from kneeswarm.analysis.findings.cpu import CPU_SATURATED_PCT, CPU_WAIT_DISTURBS
from kneeswarm.analysis.findings.finding import finding

logger = logging.getLogger(__name__)

RETROGRADE_DROP = 0.05  # specified, no published figure: QPS at a higher step >= 5 % below the peak
# ... and by more than the two steps' counting resolution: in a closed loop a window edge cuts at
# most one request per user, so a step's QPS is known to about users / window_s (a false alarm seen: the
# knee-mode target, 80/s flat past 4 users, read 80.2 then 75.5/s at 8 and 16 users over 2 s
# windows, where the resolution is 4 + 8/s): ``qps_resolution``.
# Error categories that mean "the server refused": kneeswarm/contracts/rundir.py names http_4xx/http_5xx;
# 429 and 503 are what bounded queues answer (the demo target: 503 when its queue is full).
PUSHBACK_CATEGORIES = ("http_429", "http_503", "http_5xx")
# "Latency exploding": P99 at the last step >= 10x the knee step's.  The article: 500 ms -> 8 s
# (16x) behind an unbounded queue.  A closed loop past its knee already stretches latency in
# proportion to users (Little's law), so the factor must sit above the usual 2-8x step ranges.
UNBOUNDED_LATENCY_FACTOR = 10.0
# In a closed loop no queue holds more requests than there are users, and past the knee Little's
# law stretches latency as users / throughput: P99 must also grow this many times beyond that
# (measured: a 16 x 2-thread ONNX target's P99 grew 10.6x from 1 to 16 users at 191 ->
# 221/s, where users / throughput alone grew 13.8x).  No published figure: twice, as the users
# double from step to step.
UNBOUNDED_BEYOND_LITTLE = 2.0
LATENCY_RISE = 1.5  # waiting_not_computing: P99 rose >= 1.5x from the knee to the last step ...
# ... or P50 did: a P99 over a few hundred requests is their second or third largest, which one
# scheduler stall moves (measured: the knee-mode target on a host others kept full, P50
# 59 -> 203 ms from 4 to 16 users while P99 read 226 -> 308 ms over 2.8 s windows).
LATENCY_QUANTILES = ("p99_ms", "p50_ms")
CPU_NOT_SATURATED_PCT = 70.0  # ... while the process used below 70 % of the CPUs ...
# ... and it was not waiting for a CPU: its threads' run delay under cpu.py CPU_WAIT_DISTURBS of
# its requests' time (Context.cpu_wait_share); where that is not measured, the host below
# cpu_saturated's "full" (cpu.py CPU_SATURATED_PCT).  The host's busy share alone is not the
# service's: on a host shared with the load generator and other work, they fill it (measured: the
# knee-mode target at 3.5 % of 2 CPUs, waiting for a CPU 0.4-5 % of its requests' time, while
# the host was 100 % busy).
HOST_FULL_PCT = CPU_SATURATED_PCT
GPU_BUSY_PCT = 80.0  # ... and no GPU was busy (a busy GPU is computing, not waiting)
# The residual rule stays silent when one of these already names the cause.
EXPLAINED_BY = ("cpu_saturated", "run_queue_over_cores", "single_thread_bound", "gpu_serialized", "io_wait",
                "generator_bound", "host_contended", "efficiency_falling", "latency_swinging",
                "cpu_throttled", "kv_cache_full", "preemption", "queue_growing", "prefill_bound", "decode_bound")


def qps_resolution(step: SummaryStep) -> float:
    """users / window_s of a step (0 when either is missing)."""
    u, w = num(step.get("users")), num(step.get("window_s"))
    return u / w if u is not None and w is not None and w > 0 else 0.0


def retrograde(ctx: Context) -> list[Finding]:
    if not ctx.valid:
        return []
    peak = max(ctx.valid, key=lambda s: known(s, "qps"))
    pq, pu = known(peak, "qps"), known(peak, "users")
    later = [s for s in ctx.valid if known(s, "users") > pu and known(s, "qps") <= (1 - RETROGRADE_DROP) * pq
             and pq - known(s, "qps") > qps_resolution(peak) + qps_resolution(s)]
    if pq <= 0 or not later:
        return []
    worst = min(later, key=lambda s: known(s, "qps"))
    wq = known(worst, "qps")
    drop = 1 - wq / pq
    return [finding("retrograde", [peak, *later], {"peak_users": peak["users"], "peak_qps": pq,
                                                  "users": worst["users"], "qps": wq,
                                                  "drop": drop, "threshold": RETROGRADE_DROP},
                    f"QPS fell {drop:.0%} from its peak {pq:,.1f}/s at {users_text(peak['users'])} to {wq:,.1f}/s "
                    f"at {users_text(worst['users'])}: more concurrency made the service slower.",
                    f"Cap the concurrency at about {users_text(peak['users'])} per instance (pool size, admission limit) "
                    "and scale out with replicas; read the CPU findings for the crosstalk behind the drop.")]


def _generator_top(step: SummaryStep) -> tuple[str | None, float | None]:
    cpu = {w: v for w, x in as_dict(as_dict(step.get("generator")).get("cpu_pct")).items() if (v := num(x)) is not None}
    if cpu:
        return max(cpu.items(), key=lambda kv: kv[1])
    return None, num(step.get("generator_cpu_max"))


def generator_bound(ctx: Context) -> list[Finding]:
    tops = [(s, *_generator_top(s)) for s in ctx.steps]
    hits = [(s, w, v) for s, w, v in tops if v is not None and v > ctx.generator_cpu_max]
    if not hits:
        return []
    step, worker, cpu = max(hits, key=lambda h: h[2])
    return [finding("generator_bound", [h[0] for h in hits],
                    {"users": step["users"], "worker": worker, "cpu_pct": cpu, "limit_pct": ctx.generator_cpu_max,
                     "invalid_steps": sum(1 for h in hits if h[0].get("valid") is False)},
                    f"The load generator ran at {cpu:.0f}% CPU (worker {worker or '?'}) at {users_text(step['users'])}: "
                    "it, not the server, may have been the bottleneck, so those steps are not trusted.",
                    "Add Locust workers (--workers) or load machines, use FastHttpUser, or give the generator "
                    "at least the server's class of machine.")]


def pushback_rate(ctx: Context, step: SummaryStep) -> float | None:
    """Refusals per second: the target's own rejected_s where exported, else 429/503/5xx errors."""
    rejected = [v for h in ctx.server_hosts() if (v := ctx.metric(step, h, "target.rejected_s")) is not None]
    if rejected:
        return sum(rejected)
    errors = step.get("errors")
    if not isinstance(errors, dict):
        return None
    count = sum(v for k, x in errors.items() if k in PUSHBACK_CATEGORIES and (v := num(x)) is not None)
    window = num(step.get("window_s"))
    return count / window if window and window > 0 else count


def _span(ctx: Context) -> tuple[SummaryStep, SummaryStep] | None:
    """(the knee step, else the first valid step; the last valid step), when they differ."""
    if not ctx.valid:
        return None
    base, last = ctx.knee_step() or ctx.valid[0], ctx.valid[-1]
    return (base, last) if known(last, "users") > known(base, "users") else None


def queue_pushback(ctx: Context) -> list[Finding]:
    span = _span(ctx)
    if span is None:
        return []
    base, last = span
    r0, r1 = pushback_rate(ctx, base), pushback_rate(ctx, last)
    if r0 is None or r1 is None or r1 <= 0 or r1 <= r0:
        return []
    steps = [s for s in ctx.steps if known(s, "users") >= known(base, "users") and (pushback_rate(ctx, s) or 0) > 0]
    return [finding("queue_pushback", steps, {"from_users": base["users"], "to_users": last["users"],
                                              "rejected_s_from": r0, "rejected_s_to": r1,
                                              "error_rate": num(last.get("error_rate"))},
                    f"Refusals rose from {r0:,.1f}/s at {users_text(base['users'])} to {r1:,.1f}/s at {users_text(last['users'])}: "
                    "a bounded queue is pushing back instead of queueing forever (healthy).",
                    "Keep the bound; size it as tolerated queueing time / single-inference time x threads, "
                    "and have clients retry with backoff or shed load upstream.")]


def _little_growth(base: SummaryStep, last: SummaryStep) -> float | None:
    """How much users / throughput grew from ``base`` to ``last`` (closed loop: the latency growth
    the added users alone explain); None when a step lacks users or throughput."""
    u0, u1, x0, x1 = num(base.get("users")), num(last.get("users")), num(base.get("qps")), num(last.get("qps"))
    if u0 is None or u1 is None or x0 is None or x1 is None or min(u0, u1, x0, x1) <= 0:
        return None
    return (u1 / x1) / (u0 / x0)


def unbounded_queue(ctx: Context) -> list[Finding]:
    span = _span(ctx)
    if span is None:
        return []
    base, last = span
    p0, p1 = num(base.get("p99_ms")), num(last.get("p99_ms"))
    if p0 is None or p1 is None or p0 <= 0 or p1 < UNBOUNDED_LATENCY_FACTOR * p0:
        return []
    little = _little_growth(base, last) if ctx.loop == "closed" else None
    if little is not None and p1 / p0 < UNBOUNDED_BEYOND_LITTLE * little:
        return []
    if any((pushback_rate(ctx, s) or 0) > 0 for s in ctx.steps if known(s, "users") >= known(base, "users")):
        return []
    queue = [v for h in ctx.server_hosts() if (v := ctx.metric(last, h, "target.queue_length")) is not None]
    return [finding("unbounded_queue", [base, last], {"from_users": base["users"], "to_users": last["users"],
                                                      "p99_ms_from": p0, "p99_ms_to": p1, "growth": p1 / p0,
                                                      "little_growth": little,
                                                      "rejected": 0, "queue_length": max(queue) if queue else None},
                    f"P99 grew {p1 / p0:.0f}x ({p0:,.0f} -> {p1:,.0f} ms) from {base['users']} to {last['users']} "
                    "users with no request refused: requests wait in a queue with no bound, the service looks "
                    "alive while every caller times out.",
                    "Bound the queue in front of the pool (e.g. tolerated wait / inference time x threads) and "
                    "answer 429/503 when it is full (or run the caller's task: CallerRuns).")]


def _not_computing(ctx: Context, s: SummaryStep, h: str) -> float | None:
    """The step's busy % on host h (the process's share of the CPUs where measured, else the
    host's) when it shows no computing limit, else None; not measured reads as 0.

    A limit: a busy GPU, the process at CPU_NOT_SATURATED_PCT of the CPUs, or its threads waiting
    for a CPU (CPU_WAIT_DISTURBS; not measured: the host at HOST_FULL_PCT); without the process
    measured, the host at CPU_NOT_SATURATED_PCT."""
    cpus = ctx.service_cpus(h)
    busy, proc, gpu = ctx.host_busy(s, h), ctx.metric(s, h, "cpu_pct"), ctx.metric(s, h, "sm_pct")
    if gpu is not None and gpu >= GPU_BUSY_PCT:
        return None
    wait = ctx.cpu_wait_share(s, h)
    if (wait is not None and wait >= CPU_WAIT_DISTURBS) or (wait is None and busy is not None and busy >= HOST_FULL_PCT):
        return None
    share = proc / cpus if proc is not None and cpus is not None else None
    if share is not None:
        return share if share < CPU_NOT_SATURATED_PCT else None
    if busy is not None:
        return busy if busy < CPU_NOT_SATURATED_PCT else None
    return 0.0


def _cpu_idle_everywhere(ctx: Context, steps: list[SummaryStep]) -> dict[str, float] | None:
    """{host: the service's worst busy %} when no measured host showed a computing limit, else None."""
    worst: dict[str, float] = {}
    measured = False
    for h in ctx.server_hosts():
        for s in steps:
            busy = _not_computing(ctx, s, h)
            if busy is None:
                return None
            measured = measured or ctx.host_busy(s, h) is not None or ctx.metric(s, h, "cpu_pct") is not None
            worst[h] = max(worst.get(h, 0.0), busy)
    return worst if measured else None


def waiting_not_computing(ctx: Context, found: set[str]) -> list[Finding]:
    ks, late = ctx.knee_step(), ctx.late()
    if ks is None or len(late) < 2 or found.intersection(EXPLAINED_BY):
        return []
    last = late[-1]
    rises = {q: (a, b) for q in LATENCY_QUANTILES
             if (a := num(ks.get(q))) is not None and (b := num(last.get(q))) is not None and a > 0}
    if not any(b >= LATENCY_RISE * a for a, b in rises.values()):
        return []
    p0, p1 = rises.get("p99_ms", (None, None))
    q, (l0, l1) = max(rises.items(), key=lambda kv: kv[1][1] / kv[1][0])
    idle = _cpu_idle_everywhere(ctx, late)
    if idle is None:
        return []
    host, busy = max(idle.items(), key=lambda kv: kv[1])
    host_busy = max((b for s in late if (b := ctx.host_busy(s, host)) is not None), default=None)
    return [finding("waiting_not_computing", late, {"host": host, "cpu_busy_pct_max": max(busy, host_busy or 0.0),
                                                    "service_busy_pct_max": busy, "host_busy_pct_max": host_busy,
                                                    "p99_ms_knee": p0, "p99_ms_last": p1,
                                                    "p50_ms_knee": rises.get("p50_ms", (None, None))[0],
                                                    "p50_ms_last": rises.get("p50_ms", (None, None))[1],
                                                    "knee_users": ks["users"], "users": last["users"]},
                    f"Throughput stopped growing at {users_text(ks['users'])} and {q[:3].upper()} rose {l1 / l0:.1f}x by "
                    f"{last['users']} "
                    f"users, yet the service kept the CPU at most {busy:.0f}% busy ({host}"
                    + (f"; the host at most {host_busy:.0f}%" if host_busy is not None else "")
                    + ") and no other cause showed: the "
                    "engine is waiting on something — a lock, a fixed pool or semaphore, a queue, IO.",
                    "Look for a fixed number of slots (pool size, max concurrency, semaphore) or a lock on the "
                    "request path; profile off-CPU time (py-spy dump, perf sched, offcputime).")]

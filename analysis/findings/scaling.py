"""How the work per CPU and the spread of latency change with the load: the memory-bandwidth wall
(``efficiency_falling``) and threads fighting over scheduling (``latency_swinging``), the last two
of the method's CPU rules (seed/DIGEST.md, "Bottleneck rules").

``efficiency_falling`` reads every valid step (the wall can start before the knee);
``latency_swinging`` the steps at or after the knee, against the step before it.
"""

from __future__ import annotations

import logging
from typing import Any

from kneeswarm.analysis.findings.context import Context, users_text
from kneeswarm.analysis.schema.summary import Finding, SummaryStep, num
from kneeswarm.analysis.findings.cpu import cpu_full_by_service
from kneeswarm.analysis.findings.finding import finding

logger = logging.getLogger(__name__)

# efficiency_falling: QPS per CPU-second of the monitored process.  The digest: "past ~half the
# physical cores, CPU% still rises but useful work per second falls".  No published figures:
EFFICIENCY_DROP = 0.20  # at least a fifth below the best earlier step: twice the 10 % within
#                         which the other rules treat two steps' QPS as the same (QPS_FLAT, Little)
CPU_STILL_RISING = 0.10  # ... at a step where the process's CPU rose at least 10 % over the step before
# ... and the process used at least half the physical cores' time (the digest's "past about half
# the physical cores"; below it the wall cannot be reached, and a near-idle process's QPS per
# CPU-second swings with its fixed costs)
EFFICIENCY_MIN_CORES = 0.5

# latency_swinging: P99 / P50 of a step, with the service's CPUs full by the service's own work
# (cpu.cpu_full_by_service: cpu_saturated's "full", CPU_SATURATED_PCT busy and SATURATED_SHARE_MIN
# of it the service's; a host others filled is host_contended, not threads of the service fighting).
# The digest: "CPU full and RT swinging high => threads are fighting over scheduling", as distinct
# from a steady queue, where every request waits about as long (the knee-mode target measured
# P99/P50 1.1 at 4x its slots).  No published figures:
SWING_GROWTH = 1.5  # the spread at least 1.5x the spread at the step before the knee ...
SWING_MIN_SPREAD = 2.0  # ... and P99 at least twice P50


def _efficiency(c: Context, s: SummaryStep, h: str) -> tuple[float, float] | None:
    """(process CPUs' worth used, QPS per CPU-second) of a step, when both are measured and positive."""
    proc, qps = c.metric(s, h, "cpu_pct"), num(s.get("qps"))
    if proc is None or qps is None or proc <= 0 or qps <= 0:
        return None
    cpus = proc / 100.0
    return cpus, qps / cpus


def _efficiency_drop(c: Context, h: str, cores: float) -> tuple[SummaryStep, SummaryStep, float, float, float, float] | None:
    """(best earlier step, falling step, their CPUs and efficiencies: cpus0, eff0, cpus1, eff1) of
    the largest fall at a step whose CPU rose CPU_STILL_RISING over the step before it."""
    seen: list[tuple[SummaryStep, float, float]] = []  # (step, cpus, efficiency) in users order
    falls = []
    for s in c.valid:
        e = _efficiency(c, s, h)
        if e is None:
            continue
        cpus, eff = e
        if seen and cpus >= EFFICIENCY_MIN_CORES * cores and cpus >= (1 + CPU_STILL_RISING) * seen[-1][1]:
            best, bcpus, beff = max(seen, key=lambda x: x[2])
            if eff <= (1 - EFFICIENCY_DROP) * beff:
                falls.append((best, s, bcpus, beff, cpus, eff))
        seen.append((s, cpus, eff))
    return min(falls, key=lambda f: f[5] / f[3]) if falls else None


def efficiency_falling(ctx: Context) -> list[Finding]:
    out = []
    for h in ctx.server_hosts():
        cores = ctx.cpu_fact(h, "physical_cores") or ctx.cpu_fact(h, "logical_cpus")
        drop = None if cores is None else _efficiency_drop(ctx, h, cores)
        if drop is None:
            continue
        best, s, bcpus, beff, cpus, eff = drop
        out.append(finding("efficiency_falling", [best, s],
                           {"host": h, "from_users": best["users"], "users": s["users"], "qps_per_cpu_s_from": beff,
                            "qps_per_cpu_s": eff, "drop": 1 - eff / beff, "cpus_from": bcpus, "cpus": cpus,
                            "physical_cores": cores, "threshold": EFFICIENCY_DROP},
                           f"{h}: QPS per CPU-second fell {1 - eff / beff:.0%} ({beff:,.1f} -> {eff:,.1f}) from "
                           f"{users_text(best['users'])} to {users_text(s['users'])} while the service's CPU rose "
                           f"{bcpus:.1f} -> {cpus:.1f} CPUs: each cycle does less useful work (the memory-bandwidth "
                           "wall, or cycles spent spinning and switching).",
                           "Use fewer compute threads (about half the physical cores for memory-bound models), "
                           "batch requests so weights are read once per batch, and check memory bandwidth "
                           "(perf stat -e cycles,instructions; a falling IPC confirms it)."))
    return out


def _spread(s: SummaryStep) -> float | None:
    p50, p99 = num(s.get("p50_ms")), num(s.get("p99_ms"))
    return p99 / p50 if p50 is not None and p99 is not None and p50 > 0 else None


def latency_swinging(ctx: Context) -> list[Finding]:
    base = ctx.before_knee() or (ctx.valid[0] if ctx.valid else None)
    b = None if base is None else _spread(base)
    u0 = None if base is None else num(base.get("users"))
    if base is None or b is None or u0 is None:
        return []
    out = []
    for h in ctx.server_hosts():
        hits = [(s, sp) for s in ctx.late() if (u := num(s["users"])) is not None and u > u0
                and cpu_full_by_service(ctx, s, h)
                and (sp := _spread(s)) is not None and sp >= SWING_MIN_SPREAD and sp >= SWING_GROWTH * b]
        if not hits:
            continue
        s, sp = max(hits, key=lambda x: x[1])
        out.append(finding("latency_swinging", [x[0] for x in hits],
                           {"host": h, "from_users": base["users"], "users": s["users"], "spread_from": b, "spread": sp,
                            "p50_ms": num(s.get("p50_ms")), "p99_ms": num(s.get("p99_ms")),
                            "busy_pct": ctx.service_busy(s, h), "service_cpus": ctx.service_cpus(h),
                            "threshold": SWING_GROWTH},
                           f"{h}: with the CPUs {ctx.service_busy(s, h):.0f}% busy at {users_text(s['users'])}, P99 was "
                           f"{sp:.1f}x P50 (it was {b:.1f}x at {users_text(base['users'])}): response times swing, "
                           "threads are fighting over the CPUs rather than waiting in a steady queue.",
                           "Fewer runnable threads than cores (request pool x engine threads), pin them "
                           "(taskset, OMP_PROC_BIND), and bound the queue so waiting happens in line, not "
                           "in the scheduler."))
    return out

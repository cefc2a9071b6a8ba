"""Which finding explains which: the cause first, its consequences folded under it.

Several rules often fire on one bottleneck: a container's CPU quota (``cpu_throttled``) also fills
the CPUs it may use (``cpu_saturated``), lengthens its run queue (``run_queue_over_cores``) and
bends the curve down (``retrograde``).  Listed side by side, the consequence that sounds worst
(a CRITICAL retrograde) leads and the cause comes last.  ``CAUSES`` says, once, which finding
explains which (docs/findings.md shows the same table; a test holds the two equal), and
``link`` applies it to one run's findings:

* a finding is **explained** by another present finding whose consequences list its id, on the
  same host (or either of them not tied to a host: the load's own findings);
* the **root causes** are the findings nothing present explains; where two independent causes
  hold, both lead;
* a consequence's severity never exceeds its root cause's (a retrograde curve inside a CPU quota
  is the quota's warning, not a critical of its own).

Why each link (the seed's article and the kernel's behaviour):

* ``cpu_throttled``: the quota is spent, so the CPUs the service may use are full (the engine's
  threads, counted against those CPUs, oversubscribe the quota rather than the host), runnable
  threads wait (run queue), throttled threads are switched out (involuntary switches) and, when
  the period refreshes, all wake at once and are spread over the CPUs (migrations); more users
  inside the same quota only add waiting (retrograde, latency swinging, falling efficiency).
* ``engine_oversubscribed`` / ``threads_over_cores``: more busy threads than cores is what
  makes the context-switch storm, the migrations, the kernel time and the long run queue, and
  past the cores throughput falls (the article's 16 -> 32 threads: QPS -23 %, 4x switches).
* ``host_contended``: other work keeps the service's threads waiting (run queue, swinging
  latency, a falling curve).
* ``kv_cache_full``: a full KV cache makes the engine preempt sequences and queue new ones.
* ``generator_bound``: a load generator out of CPU cannot hold the load it claims: the curve
  and the latencies it measured are its own limit, not the server's.
* ``model_copies``: a model copied per request grows the RSS towards the memory limit.
* ``switch_storm``: switching is kernel time.
* ``adapters_over_capacity``: requests whose adapter is not loaded wait for a slot and its swap
  (a class looks served after the others; the server waits on loads, not on compute; its queue
  grows while the batch holds the adapters it may run).
"""

from __future__ import annotations

import logging
from typing import Any
from kneeswarm.analysis.schema.summary import Finding, Verdict

logger = logging.getLogger(__name__)

#: cause -> the findings it explains (every id here is a finding id: tests/test_findings_causes.py)
CAUSES: dict[str, tuple[str, ...]] = {
    "generator_bound": ("retrograde", "latency_swinging", "efficiency_falling", "waiting_not_computing"),
    "cpu_throttled": ("engine_oversubscribed", "cpu_saturated", "run_queue_over_cores", "threads_over_cores", "switch_storm",
                      "migrations_high", "retrograde", "latency_swinging", "efficiency_falling"),
    "host_contended": ("run_queue_over_cores", "switch_storm", "retrograde", "latency_swinging"),
    "engine_oversubscribed": ("threads_over_cores", "cpu_saturated", "run_queue_over_cores", "switch_storm",
                              "migrations_high", "kernel_time_high", "retrograde", "latency_swinging",
                              "efficiency_falling"),
    "threads_over_cores": ("run_queue_over_cores", "switch_storm", "migrations_high", "kernel_time_high",
                           "retrograde", "latency_swinging", "efficiency_falling"),
    "cpu_saturated": ("run_queue_over_cores", "retrograde", "latency_swinging"),
    "switch_storm": ("kernel_time_high",),
    "kv_cache_full": ("preemption", "queue_growing", "retrograde"),
    "model_copies": ("memory_limit_near",),
    "adapters_over_capacity": ("class_starved", "waiting_not_computing", "queue_growing"),
}
LEVELS = ("info", "warning", "critical")  # low to high


def _host(f: Finding) -> Any:
    ev = f.get("evidence")
    return ev.get("host") if isinstance(ev, dict) else None


def explains(cause: Finding, effect: Finding) -> bool:
    """``cause`` explains ``effect``: the table says so and they are on the same host (or either is
    the load's own, tied to no host)."""
    if effect.get("id") not in CAUSES.get(str(cause.get("id")), ()):
        return False
    a, b = _host(cause), _host(effect)
    return a is None or b is None or a == b


def _nearest_cause(f: Finding, found: list[Finding]) -> Finding | None:
    """The present finding that explains ``f`` most directly: one that itself is explained by no
    other candidate (the nearest link of the chain), else the first."""
    candidates = [c for c in found if c is not f and explains(c, f)]
    nearest = [c for c in candidates if not any(d is not c and explains(c, d) and explains(d, f) for d in candidates)]
    return nearest[0] if nearest else (candidates[0] if candidates else None)


def root_of(f: Finding, found: list[Finding]) -> Finding:
    """Follow ``f``'s causes up to the finding nothing present explains (the table has no cycle)."""
    seen = {id(f)}
    while (up := _nearest_cause(f, found)) is not None and id(up) not in seen:
        seen.add(id(up))
        f = up
    return f


def link(found: list[Finding]) -> list[Finding]:
    """``found`` with ``explained_by`` on every consequence, ``consequences`` on every cause, and
    each consequence's severity capped at its root cause's; ordered root first, each followed by
    what it explains (in place; returned for convenience)."""
    for f in found:
        f.pop("explained_by", None)
        f.pop("consequences", None)
    for f in found:
        cause = _nearest_cause(f, found)
        if cause is not None:
            f["explained_by"] = cause["id"]
            cause.setdefault("consequences", [])
            if f["id"] not in cause["consequences"]:
                cause["consequences"].append(f["id"])
    for f in found:
        root = root_of(f, found)
        if root is not f and _level(f) > _level(root):
            f["rule_severity"] = f.get("rule_severity") or f["severity"]
            f["severity"] = root["severity"]
    return ordered(found)


def _level(f: Finding) -> int:
    severity = f.get("severity")
    return LEVELS.index(severity) if severity in LEVELS else -1


def roots(found: list[Finding]) -> list[Finding]:
    """The root causes, most severe first (stable within a severity)."""
    top = [f for f in found if not f.get("explained_by")]
    return sorted(top, key=lambda f: -_level(f))


def ordered(found: list[Finding]) -> list[Finding]:
    """Root causes most severe first, each followed by the findings under it (depth first)."""
    out: list[Finding] = []

    def visit(f: Finding) -> None:
        if any(f is g for g in out):
            return
        out.append(f)
        for g in found:
            if g.get("explained_by") == f["id"] and _nearest_cause(g, found) is f:
                visit(g)

    for r in roots(found):
        visit(r)
    out += [f for f in found if not any(f is g for g in out)]  # unreachable only if the table had a cycle
    return out


def first_sentence(text: str) -> str:
    """The first sentence of an advice: the first change to make."""
    head, dot, _ = text.partition(". ")
    return head + "." if dot else text


def suspected_cause(root: Finding, marginal: list[Finding]) -> Finding | None:
    """A marginal finding, at the same point, that would explain the confirmed ``root`` (the chain's
    cause sits at its threshold within this run's noise: a KV cache 79.5 % full against 80 %, while
    the preemptions it causes are plain), the most supported first; None when there is none."""
    up = [m for m in marginal if m.get("at_point") and explains(m, root)]
    return max(up, key=lambda m: float(m.get("support") or 0.0)) if up else None


def verdict(found: list[Finding], marginal: list[Finding] | None = None) -> Verdict:
    """``verdict``: the root causes' ids and one sentence per cause naming it, its evidence (the
    finding's own text says the numbers) and the first change to make.  A root whose own cause in
    the chain is marginal (``suspected_cause``) says so, and ``suspected`` lists those causes: the
    consequence is what this run shows for sure, the cause what it most likely is."""
    top = [f for f in roots(found) if f.get("severity") in ("critical", "warning")]
    if not top:
        return {"causes": [], "text": ""}
    parts, suspected = [], []
    for f in top:
        also = f.get("consequences") or []
        tail = f" It explains {', '.join(f'`{c}`' for c in also)}." if also else ""
        if (m := suspected_cause(f, marginal or [])) is not None:
            suspected.append(str(m["id"]))
            tail += (f" Its likely cause, `{m['id']}`, is marginal at this run's noise (support "
                     f"{float(m.get('support') or 0.0):.2f}): {m.get('text', '')}")
        parts.append(f"`{f['id']}`: {f.get('text', '')} First change: {first_sentence(str(f.get('advice', '')))}{tail}")
    lead = "Cause" if len(parts) == 1 else f"{len(parts)} independent causes"
    out: Verdict = {"causes": list(dict.fromkeys(f["id"] for f in top)), "text": f"{lead}: " + " ".join(parts)}
    if suspected:
        out["suspected"] = list(dict.fromkeys(suspected))
    return out


def link_marginal(marginal: list[Finding], confirmed: list[Finding]) -> None:
    """A marginal finding that a confirmed one explains says so (``explained_by``), in place."""
    for f in marginal:
        cause = next((c for c in confirmed if explains(c, f)), None)
        if cause is not None:
            f["explained_by"] = cause["id"]

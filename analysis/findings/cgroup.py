"""Container rules: a CPU quota that throttles the service, a memory limit close to its RSS.

They read the cgroup the agent sampled (collectors/cgroup.py): the steps' ``throttled_share``
(throttled CFS periods / periods, kneeswarm.analysis.measure.serverstats) and the host facts' ``service``
{``cpus``, ``bound``, ``memory_limit_mb``} (kneeswarm.analysis.measure.hostfacts).  A host without a quota gives no
periods and so no throttled share: ``cpu_throttled`` cannot fire there.
"""

from __future__ import annotations

import logging
from typing import Any

from kneeswarm.analysis.findings.context import Context, as_dict, users_text
from kneeswarm.analysis.schema.summary import Finding, num
from kneeswarm.analysis.findings.finding import finding

logger = logging.getLogger(__name__)

# kubernetes-mixin's CPUThrottlingHigh alert (alerts/resource_alerts.libsonnet, cpuThrottlingPercent:
# 25): throttled periods / periods above 25 % over the window means the limit, not the work, sets
# the pace.  Read at and after the knee (Context.late), like the other causes of a knee.
CPU_THROTTLED_SHARE = 0.25
# The Kubernetes Vertical Pod Autoscaler's recommender keeps 15 % above the usage it sees
# (--recommendation-margin-fraction=0.15): an RSS within that margin of the memory limit leaves
# less headroom than the autoscaler itself would, and the OOM killer acts at the limit.
MEMORY_LIMIT_MARGIN = 0.15


def _hosts_with(ctx: Context, key: str) -> list[str]:
    return [h for h in ctx.server_hosts() if any(ctx.metric(s, h, key) is not None for s in ctx.steps)]


def cpu_throttled(ctx: Context) -> list[Finding]:
    out = []
    for h in _hosts_with(ctx, "throttled_share"):
        hits = [(s, v) for s in ctx.late() if (v := ctx.metric(s, h, "throttled_share")) is not None
                and v > CPU_THROTTLED_SHARE]
        if not hits:
            continue
        worst, share = max(hits, key=lambda sv: sv[1])
        cpus = ctx.service_cpus(h)
        limit = f"{cpus:g} CPUs" if cpus is not None else "its CPU limit"
        out.append(finding("cpu_throttled", [s for s, _ in hits],
                           {"host": h, "users": worst["users"], "throttled_share": share,
                            "threshold": CPU_THROTTLED_SHARE, "service_cpus": cpus,
                            "cpus_bound": ctx.service_cpus_bound(h)},
                           f"{h}: the cgroup's CPU quota ({limit}) throttled the service in {share:.0%} of its "
                           f"periods at {users_text(worst['users'])}: the container's CPU limit is the bottleneck.",
                           "Raise the CPU limit or add replicas. Autoscale on P99 latency, not on CPU use: a "
                           "throttled container never shows more CPU than its limit, so a CPU target can look "
                           "healthy while requests queue."))
    return out


def memory_limit_near(ctx: Context) -> list[Finding]:
    out = []
    for h in ctx.server_hosts():
        limit = num(as_dict(as_dict(ctx.hosts.get(h)).get("service")).get("memory_limit_mb"))
        if limit is None or limit <= 0:
            continue
        hits = [(s, v) for s in ctx.valid if (v := ctx.metric(s, h, "rss_mb")) is not None
                and v >= limit * (1.0 - MEMORY_LIMIT_MARGIN)]
        if not hits:
            continue
        worst, rss = max(hits, key=lambda sv: sv[1])
        out.append(finding("memory_limit_near", [s for s, _ in hits],
                           {"host": h, "users": worst["users"], "rss_mb": rss, "memory_limit_mb": limit,
                            "share": rss / limit, "margin": MEMORY_LIMIT_MARGIN},
                           f"{h}: the service's RSS reached {rss:,.0f} MB of its {limit:,.0f} MB memory limit "
                           f"({rss / limit:.0%}) at {users_text(worst['users'])}: one burst more and the kernel "
                           "kills it (OOM).",
                           "Raise the memory limit (keep at least 15 % above the peak RSS) or cut the memory per "
                           "request: smaller batches, fewer model copies, a bounded cache."))
    return out

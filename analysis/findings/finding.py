"""One finding: ``{id, severity, steps, evidence, text, advice}``; ids are a contract (other tools read them).

``severity``: "critical" (the results or the service are wrong: a retrograde curve, an invalid
step), "warning" (a cause of the knee, with a setting to change), "info" (behaviour that is
healthy but worth knowing, e.g. a bounded queue pushing back).
"""

from __future__ import annotations

import logging
from typing import Mapping, Sequence

from kneeswarm.analysis.findings.context import rounded
from kneeswarm.analysis.schema.summary import Finding, SummaryStep, num

logger = logging.getLogger(__name__)

SEVERITY = {
    "cpu_saturated": "warning",
    "run_queue_over_cores": "warning",
    "threads_over_cores": "warning",
    "single_thread_bound": "warning",
    "kernel_time_high": "warning",
    "switch_storm": "warning",
    "migrations_high": "warning",
    "model_copies": "warning",
    "gpu_serialized": "warning",
    "waiting_not_computing": "warning",
    "io_wait": "warning",
    "queue_pushback": "info",
    "unbounded_queue": "critical",
    "retrograde": "critical",
    "generator_bound": "critical",
    "engine_oversubscribed": "warning",
    "host_contended": "warning",  # beyond the ids first specified: a full host that the service did not fill
    "cpu_throttled": "warning",  # services run in containers: the container's CPU quota is the bottleneck
    "memory_limit_near": "warning",  # in a container: RSS within a margin of the container's memory limit
    "efficiency_falling": "warning",  # the digest's remaining rules, to gpu_memory_creep
    "latency_swinging": "warning",
    "gpu_memory_creep": "warning",
    "kv_cache_full": "warning",  # LLM serving: the engine's own counters (llm_engine.py), to prefix_cache_cold
    "preemption": "warning",
    "queue_growing": "warning",
    "prefill_bound": "warning",
    "decode_bound": "warning",
    "prefix_cache_cold": "warning",
    "memory_growth": "warning",  # over time: a soak's trends over its windows (analysis/summary/soak.py)
    "latency_drift": "warning",
    "throughput_decay": "warning",
    "fd_growth": "warning",
    "thread_growth": "warning",
    "class_starved": "warning",  # a traffic mix: a class served after the others (analysis/findings/mix.py)
    "adapters_over_capacity": "warning",  # a mix of more LoRA adapters than the server keeps loaded (adapters.py)
}
FINDING_IDS = tuple(SEVERITY)


def users_of(steps: Sequence[SummaryStep]) -> list[int | float]:
    """The users of each step, as ints where whole."""
    out = []
    for s in steps:
        u = num(s.get("users"))
        if u is not None:
            out.append(int(u) if u.is_integer() else u)
    return out


def finding(fid: str, steps: Sequence[SummaryStep], evidence: Mapping[str, object], text: str, advice: str) -> Finding:
    """A finding dict; numbers in ``evidence`` rounded to 4 significant digits, None values left out."""
    ev = {k: (rounded(v) if isinstance(v, float) else v) for k, v in evidence.items() if v is not None}
    return {"id": fid, "severity": SEVERITY[fid], "steps": users_of(steps), "evidence": ev,
            "text": text, "advice": advice}

"""engine_oversubscribed: request threads x engine (intra-op) threads above the CPUs.

Not a per-step rule: it reads the configuration.  The knobs come from the plan when it records
them (``plan[section]`` for a section in ``KNOB_SECTIONS``, or the plan's top level, with the keys
``request_threads`` and ``intra_op_threads``), else from the command line of the monitored
process when it is the bundled demo target (``hosts[h].process.cmdline`` containing
``kneeswarm.target``).  The CPUs are those the process may use on its host (Context.service_cpus:
its cgroup's quota or cpuset, else the host's logical CPUs).

Threads that never run at once do not fight (a false alarm seen: an idle demo target, 4 x 1 threads
on 2 CPUs, got this finding): it fires only where, at a step at or after the knee, the CPUs were full
with the service's work (analysis/findings/cpu.py ``fills_cores``, on the logical CPUs).  Without
server metrics the configuration alone is reported, as before.
"""

from __future__ import annotations

import logging
import shlex
from typing import Any, TypedDict, cast

from kneeswarm.analysis.findings.context import Context, as_dict
from kneeswarm.analysis.schema.summary import Finding, PlanTable, num
from kneeswarm.analysis.findings.cpu import fills_cores
from kneeswarm.analysis.findings.finding import finding

logger = logging.getLogger(__name__)

KNOB_SECTIONS = ("target_options", "demo_target", "engine")
DEMO_TARGET_MODULE = "kneeswarm.target"
# The demo target's defaults (kneeswarm/target/server.py DEFAULT_MODE, DEFAULT_REQUEST_THREADS,
# DEFAULT_INTRA_OP_THREADS), repeated here because analysis never imports the target.
DEMO_DEFAULTS = {"mode": "onnx", "request_threads": 4, "intra_op_threads": 1}
DEMO_FLAGS = {"--mode": "mode", "--request-threads": "request_threads", "--intra-op-threads": "intra_op_threads"}


class Knobs(TypedDict, total=False):
    """An engine's thread settings: from the plan (as written there) or a demo target's command line."""

    mode: str
    request_threads: object
    intra_op_threads: object


def demo_knobs(cmdline: str) -> Knobs | None:
    """{mode, request_threads, intra_op_threads} from a demo target's command line, else None."""
    if DEMO_TARGET_MODULE not in cmdline:
        return None
    try:
        argv = shlex.split(cmdline)
    except ValueError:
        argv = cmdline.split()
    out = cast(Knobs, dict(DEMO_DEFAULTS))
    for i, arg in enumerate(argv):
        flag, _, inline = arg.partition("=")
        if flag in DEMO_FLAGS:
            value = inline or (argv[i + 1] if i + 1 < len(argv) else "")
            out[DEMO_FLAGS[flag]] = value if flag == "--mode" else (int(value) if value.isdigit() else None)  # type: ignore[literal-required]
    return out


def plan_knobs(plan: PlanTable) -> Knobs | None:
    for section in (*(as_dict(plan.get(k)) for k in KNOB_SECTIONS), plan):
        if num(section.get("request_threads")) is not None:
            return {"request_threads": section.get("request_threads"), "intra_op_threads": section.get("intra_op_threads")}
    return None


def _sources(ctx: Context) -> list[tuple[str | None, Knobs, str]]:
    """(host, knobs, where from): the plan's knobs first, else each demo target's command line."""
    demo = [(h, k, "the target's command line") for h, f in sorted(ctx.hosts.items())
            if (k := demo_knobs(str(as_dict(f.get("process")).get("cmdline") or ""))) is not None]
    pk = plan_knobs(ctx.plan)
    if pk is not None:
        host = demo[0][0] if demo else next((h for h in sorted(ctx.hosts) if ctx.cpu_fact(h, "logical_cpus")), None)
        return [(host, pk, "the plan")]
    return [d for d in demo if d[1].get("mode") == "onnx"]


def _competed(ctx: Context, host: str, cpus: float) -> bool:
    """The CPUs were full with the service's work at a late step, or the host was not measured."""
    measured = [s for s in ctx.late() if ctx.host_busy(s, host) is not None
                or ctx.metric(s, host, "cpu_pct") is not None]
    return not measured or any(fills_cores(ctx, s, host, cpus) for s in measured)


def engine_oversubscribed(ctx: Context) -> list[Finding]:
    out = []
    for host, knobs, source in _sources(ctx):
        cpus = ctx.service_cpus(host) if host else None  # a plan's knobs name no host: its CPUs unknown
        req, intra = num(knobs.get("request_threads")), num(knobs.get("intra_op_threads"))
        if host is None or cpus is None or req is None or intra is None or intra < 0:
            continue
        engine = intra or ctx.cpu_fact(host, "physical_cores") or cpus  # 0: ONNX Runtime's default, one per core
        if req * engine <= cpus or not _competed(ctx, host, cpus):
            continue
        out.append(finding("engine_oversubscribed", [],
                           {"host": host, "request_threads": req, "intra_op_threads": engine,
                            "threads": req * engine, "logical_cpus": ctx.cpu_fact(host, "logical_cpus"),
                            "service_cpus": cpus, "source": source},
                           f"{host}: {req:.0f} request threads x {engine:.0f} engine threads = {req * engine:.0f} "
                           f"compute threads for {cpus:g} CPUs (from {source}): engine and application threads "
                           "fight over the cores.",
                           f"Keep request threads x intra_op_num_threads <= {max(cpus, 1):.0f}: with many concurrent "
                           "requests set intra_op_num_threads 1-4 and inter_op_num_threads 1 (OpenVINO "
                           "inference_num_threads, TensorRT builder threads), or fewer request threads."))
    return out

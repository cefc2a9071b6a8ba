"""Floor 3: a run directory in, report/summary.json + summary.md + index.html out.

No network, no SSH.  ``analyze(run_dir)`` works on complete, crashed and interrupted runs
alike: it rebuilds what can be derived from disk (parsed host CSVs from hosts/<host>/raw/,
kneeswarm.analysis.measure.rebuild), reports what it has, and says what is missing or was lost (summary
``warnings``, ``lost``, ``complete``: kneeswarm.analysis.measure.problems).  The pieces, one module per concept:

* kneeswarm.analysis.measure.inputs      everything read from the run directory (kneeswarm.analysis.measure.rebuild: raw -> parsed)
* kneeswarm.analysis.measure.windows     each step's steady window; means of samples over windows
* kneeswarm.analysis.measure.requestscan one pass over the request parts: per-step statistics, totals, timeline
* kneeswarm.analysis.measure.loadstats   per-step request statistics of rows in memory (``step_stats``) and validity
* kneeswarm.analysis.measure.trust       validity beyond a step's own rows: Little's law, clock-offset error bounds
* kneeswarm.analysis.findings    why the service stopped scaling (``explain``: findings, the USL fit)
* kneeswarm.analysis.measure.serverstats per-step server metrics (``server_metrics``)
* kneeswarm.analysis.measure.target      the server's own /metrics per step (``target_windows``)
* kneeswarm.analysis.summary.soak        a soak's windows as time series, their trends and findings (no knee)
* kneeswarm.analysis.models.knee        ``find_knee``, ``find_latency_knee``, ``find_peak``, ``find_tokens_knee``
* kneeswarm.analysis.measure.streaming   LLM streaming per step: TTFT/ITL/TPOT, tokens/s, goodput, token-count truth
* kneeswarm.analysis.measure.loop        closed or open loop (``steps[].rate``), items per request (``items_s``)
* kneeswarm.analysis.measure.hostfacts   the report header: what each host was (``host_facts``)
* kneeswarm.analysis.measure.problems    warnings and losses of meta.json, the hosts and analysis, merged
* kneeswarm.analysis.summary.build     summary.json/summary.md (``build_summary``, ``to_markdown``)
* kneeswarm.analysis.reports.html      index.html (``render_html``)
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, TypedDict, cast

import pandas as pd

from kneeswarm.analysis.findings import explain
from kneeswarm.analysis.findings.causes import link, link_marginal, verdict
from kneeswarm.analysis.schema.summary import Goodput, Knee, PlanTable, ServerMetrics, Summary
from kneeswarm.analysis.summary.classes import add_mix, target_prometheus
from kneeswarm.analysis.summary.confidence import judge
from kneeswarm.analysis.summary.gates import add_gates
from kneeswarm.analysis.reports.junit import write_junit
from kneeswarm.analysis.measure.hostfacts import host_facts
from kneeswarm.analysis.measure.inputs import RunInputs, load_inputs
from kneeswarm.analysis.models.knee import (find_knee, find_latency_knee, find_peak, find_tokens_knee, kneedle_warnings)
from kneeswarm.analysis.measure.llmworkload import llm_workload
from kneeswarm.analysis.measure.loop import load_facts
from kneeswarm.analysis.measure.loadstats import data_loss_reasons, generator_cpu, step_stats, validate_steps
from kneeswarm.analysis.measure.problems import collect
from kneeswarm.analysis.measure.resample import Replicates, step_replicates
from kneeswarm.analysis.reports.html import render_html
from kneeswarm.analysis.summary.search import bracket_at_noise, read_search, search_section
from kneeswarm.analysis.measure.serverstats import server_metrics
from kneeswarm.analysis.summary.soak import soak_findings, soak_knees, soak_section
from kneeswarm.analysis.measure.streaming import ITL_COLUMNS, count_reasons, goodput_limits, has_streaming
from kneeswarm.analysis.summary.build import (build_summary, endpoint_facts, jsonable, step_records, to_json, workload_facts)
from kneeswarm.analysis.reports.markdown import to_markdown
from kneeswarm.analysis.measure.target import PROMETHEUS_STREAM, target_series_used
from kneeswarm.analysis.measure.trust import add_reasons, sla_error_rate, trust_reasons
from kneeswarm.analysis.models.usl import fit_usl
from kneeswarm.analysis.measure.workers import lost_worker_reasons, worker_table
from kneeswarm.contracts.plan import is_soak
from kneeswarm.contracts.rundir import HOLD_NOTES, write_text

logger = logging.getLogger(__name__)

__all__ = ["analyze", "summarize", "step_stats", "find_knee", "find_latency_knee", "find_peak", "to_markdown"]


def hold_reasons(stats: pd.DataFrame, notes: bool = False) -> list[list[str]]:
    """Per step, the master's reason (steps.csv ``hold_reason``) when it held the step to max_hold
    under ``hold = "auto"`` without it being steady and its QPS and P99 known; ``notes``: instead the
    reasons that are no flaw (rundir.HOLD_NOTES: a search's growth probe that ended once its scaling
    was certain, or a step that reached max_hold steady with its QPS known: its P99 from fewer rows
    than its interval needs, which the step's own interval carries -- it stays valid)."""
    col = stats["hold_reason"] if "hold_reason" in stats.columns else [None] * len(stats)
    return [[r] if isinstance(r, str) and r.strip() and r.startswith(HOLD_NOTES) == notes else [] for r in col]


def with_hold_reasons(stats: pd.DataFrame) -> pd.DataFrame:
    """``stats`` with steps.csv's hold reasons in ``reasons``: a step ended at max_hold not steady or not
    known is not valid; one that ended once its scaling was certain keeps its validity (a note)."""
    stats = add_reasons(stats, hold_reasons(stats))
    return add_reasons(stats, hold_reasons(stats, notes=True), invalid=False)


def per_step(inputs: RunInputs) -> tuple[pd.DataFrame, list[dict[str, float]], list[dict[str, ServerMetrics]]]:
    """(step statistics with ``valid`` and ``reasons``, generator CPU per step, server metrics per step)."""
    s = inputs.settings
    stats = inputs.scan.stats
    t_lo, t_hi = stats["t_lo"].to_numpy(dtype=float), stats["t_hi"].to_numpy(dtype=float)
    gen = generator_cpu(inputs.generator, t_lo, t_hi)
    lost = data_loss_reasons(stats, inputs.scan.workers, inputs.unreadable_parts, inputs.generator,
                             inputs.generator_unreadable)
    stats = validate_steps(stats, s.min_requests, gen, s.generator_cpu_max, lost)
    stats = add_reasons(stats, trust_reasons(stats, inputs.think_ms, inputs.closed_loop, inputs.clock_bounds,
                                             sla_error_rate(inputs.plan)))
    stats = add_reasons(stats, lost_worker_reasons(stats, inputs.meta, inputs.scan.t0))
    stats = add_reasons(stats, count_reasons(stats))  # usage disagrees with a tokenizer or a pinned length
    stats = with_hold_reasons(stats)
    for row in stats.loc[stats["foreign_rows"] > 0].to_dict("records"):
        inputs.warnings.add(f"step {row['index']:g}: {row['foreign_rows']:,} rows in its steady window were recorded "
                            "under another step and left out")
    return stats, gen, server_metrics(inputs.hosts, t_lo, t_hi)


def summarize(inputs: RunInputs) -> Summary:
    """The summary dict of a loaded run (no files written)."""
    s = inputs.settings
    stats, gen, server = per_step(inputs)
    good = stats.loc[stats["valid"].to_numpy(dtype=bool)]
    users, qps, p99 = good["users"].to_numpy(float), good["qps"].to_numpy(float), good["p99_ms"].to_numpy(float)
    n, n_ok = inputs.scan.requests, inputs.scan.ok
    workers, worker_steps = worker_table(inputs.run_dir, stats, inputs.generator, inputs.meta)
    records = step_records(stats, server, gen, load_facts(inputs.plan), has_streaming(stats))
    for rec, per_worker in zip(records, worker_steps):
        rec["workers"] = per_worker
    if n and not n_ok:
        inputs.warnings.add(f"no request succeeded ({n:,} requests, all failed): no step is valid")
    soak = is_soak(inputs.plan.get("load") or {})  # one load held: no knee (kneeswarm.analysis.summary.soak)
    knee, latency_knee = ((soak_knees()["knee"], soak_knees()["latency_knee"]) if soak
                          else (find_knee(users, qps), find_latency_knee(users, p99)))
    extras = llm_extras(good, inputs.plan, has_streaming(stats))
    for line in kneedle_warnings(knee=knee, latency_knee=latency_knee, tokens_knee=extras.get("tokens_knee")):
        inputs.warnings.add(line)
    summary = build_summary(
        run_id=inputs.run_id,
        meta=inputs.meta,
        settings={"settle": s.settle, "min_requests": s.min_requests, "generator_cpu_max": s.generator_cpu_max},
        steps=records,
        knee=knee,
        latency_knee=latency_knee,
        peak=find_peak(users, qps),
        totals={"requests": n, "errors": n - n_ok,
                "steps": len(stats), "valid_steps": int(stats["valid"].sum())},
        hosts=host_facts(inputs.meta, inputs.hosts, inputs.parse,
                         cgroups={h: st["cgroup"] for h, st in inputs.hosts.items() if "cgroup" in st},
                         processes={h: st["process"] for h, st in inputs.hosts.items() if "process" in st},
                         trees={h: st["tree"] for h, st in inputs.hosts.items() if "tree" in st}),
        workers=workers,
        target_series={h: used for h, streams in sorted(inputs.hosts.items())
                        if (used := target_series_used(streams.get(PROMETHEUS_STREAM)))},
        problems=collect(inputs.meta, inputs.warnings.to_list(), inputs.lost),
        load=load_facts(inputs.plan),
        workload=workload_facts(inputs.plan),
        endpoint=endpoint_facts(inputs.plan),
        **extras,
        **({"llm_workload": w} if (w := llm_workload(inputs.run_dir, inputs.plan, stats)) else {}),
    )
    if soak:
        summary["soak"] = jsonable(soak_section(summary, inputs.plan))
    search = search_section(inputs.plan, summary["steps"], read_search(inputs.run_dir), summary["load"]["loop"])
    if search is not None:  # [load] mode = "search": the probes in order, with why each was chosen
        summary["search"] = jsonable(search)
    reps = None if soak else step_replicates(stats, inputs.hosts, inputs.think_ms, inputs.closed_loop)
    return add_explanations(summary, inputs.plan, reps, lambda s: add_mix(s, inputs.run_dir, stats, inputs.plan,
                                                                               target_prometheus(inputs.run_dir),
                                                                               soak=soak))


class LlmExtras(TypedDict, total=False):
    """The summary keys an LLM run adds (each declared in Summary)."""

    itl_columns: dict[str, str]
    tokens_knee: Knee
    goodput: Goodput


def llm_extras(good: pd.DataFrame, plan: PlanTable, streaming: bool = False) -> LlmExtras:
    """``tokens_knee`` (runs that recorded output tokens; valid steps), ``goodput`` {limits}, and in a
    streaming run ``itl_columns`` (what each ITL column is: per chunk, per token)."""
    out: LlmExtras = {"itl_columns": dict(ITL_COLUMNS)} if streaming else {}
    if good["tokens_s"].notna().any():
        out["tokens_knee"] = find_tokens_knee(good["users"].to_numpy(float), good["tokens_s"].to_numpy(float))
    limits = goodput_limits(plan.get("sla"))
    if limits:
        out["goodput"] = {"limits": limits}
    return out


def add_explanations(summary: Summary, plan: PlanTable, reps: Replicates | None = None,
                     mix: Callable[[Summary], None] | None = None) -> Summary:
    """``findings`` and ``usl`` (kneeswarm.analysis.findings.explain, over the valid steps only); a rule that
    failed becomes a warning.  Little's law is already in each step's reasons (kneeswarm.analysis.measure.trust).

    With ``reps`` (each step's figures resampled from its own window), the findings are judged against
    the run's noise: confirmed ones stay in ``findings``, marginal ones go to ``findings_marginal``, the
    knees get their intervals (kneeswarm.analysis.summary.confidence).

    Then ``sla`` and ``capacity`` (kneeswarm.analysis.summary.gates: the plan's [sla] and [capacity] tables over
    the summary with its findings and USL fit).
    """
    explained = explain(summary, plan)
    summary["findings"] = jsonable(explained["findings"])
    summary["usl"] = jsonable(explained["usl"])
    if summary.get("soak"):  # one load held: no scalability curve to fit; the findings of its trends instead
        summary["findings"] += jsonable(soak_findings(summary))
        summary["usl"] = jsonable({**fit_usl([], []), "caution": "a soak holds one load: no USL fit (not a step sweep)"})
    noise = judge(cast(Summary, summary), plan, reps) if reps is not None and not summary.get("soak") else []
    if mix is not None:  # a traffic mix: each class's figures and knees, its findings judged at its own noise
        mix(summary)
    summary["findings"] = link(summary["findings"])  # the cause first, its consequences under it
    link_marginal(summary.get("findings_marginal") or [], summary["findings"])
    summary["verdict"] = verdict(summary["findings"], summary.get("findings_marginal") or [])
    if isinstance(summary.get("search"), dict) and isinstance(summary.get("knee"), dict):
        bracket_at_noise(summary["search"], summary["knee"])
    summary["findings_unchecked"] = list(explained["unchecked"])
    summary["warnings"] = list(summary.get("warnings") or []) + [
        f"findings: {line} (the other rules ran)" for line in explained["rule_errors"]] + noise
    return add_gates(summary, plan)


def analyze(run_dir: str | Path) -> Summary:
    """Analyse a run directory; write report/summary.json, summary.md, index.html; return the summary."""
    inputs = load_inputs(run_dir)
    summary = summarize(inputs)
    run = inputs.run_dir
    report = run.report_dir
    write_junit(summary, report)
    write_text(run.summary_path, to_json(summary))
    write_text(run.summary_md_path, to_markdown(summary))
    scan = inputs.scan
    write_text(run.report_path, render_html(summary, scan.timeline, inputs.generator, inputs.hosts, scan.t0,
                                                  scan.bin_s))
    logger.info("%s: knee %s, peak %s; report in %s", inputs.run_id, summary["knee"], summary["peak"], report)
    return summary

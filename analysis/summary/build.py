"""The summary: one dict that becomes report/summary.json and report/summary.md.

Where the summary lives in a run directory: docs/run-directory.md.
Stable keys: run_id, complete, steps[] (index, users, requests, qps, p50_ms, p95_ms, p99_ms,
p999_ms, mean_ms, error_rate, errors, valid, reasons[]), knee {users, qps, method}, peak {users,
qps}; ``warnings`` [one line each] and ``lost`` {what: count} (kneeswarm.analysis.measure.problems: meta.json's,
each host's, and analysis's own; ``complete`` is false when anything was lost).  Also written:
latency_knee, totals, ended, analysis settings, per-step window/rps/generator/server facts
(``server[host]``: vmstat, process incl. ``sy_share`` and ``wait_pct`` (its threads' run delay:
waiting for a CPU), threads, GPU means and ``fb_peak_mb`` (the window's largest sample), and ``target``
{key: value} from the server's /metrics), ``hosts`` {host: facts} (kneeswarm.analysis.measure.hostfacts),
``target_series`` {host: {key: series used}} (kneeswarm.analysis.measure.target).  The why: ``findings`` [{id,
severity, steps, evidence, text, advice}] and ``usl`` {sigma, kappa, lambda, n_star, peak,
peak_kind, r2, points, caution, curve {users, qps}, text} (kneeswarm.analysis.findings.explain over the
valid steps), ``findings_unchecked`` [one line per LLM-engine rule the server's metrics could not feed,
not read as passed]; per step ``energy_j_per_request`` (and ``energy_j_per_token`` when output tokens were
recorded) where GPU power was recorded, and Little's-law /
clock-offset reasons (kneeswarm.analysis.measure.trust).  The loop: ``load`` {loop, batch, arrival, source_rate}
and per step ``rate`` (open loop) and ``items_s`` (batch > 1) (kneeswarm.analysis.measure.loop); per step
``tokens_s`` where output tokens were recorded, ``goodput_rps``/``goodput_share`` when ``[sla]``
limits a request (``goodput`` {limits}), and in a streaming run the TTFT/ITL/TPOT percentiles and
token-count keys of kneeswarm.analysis.measure.streaming.STEP_KEYS; ``tokens_knee`` {users, tokens_s, method} in an
LLM run.  A chunk is not a token: ``itl_columns`` {itl, itl_token} in a streaming run says what each ITL column is
(per chunk, per token: kneeswarm.analysis.measure.streaming.ITL_COLUMNS).  NaN and infinities are written as null.
"""

from __future__ import annotations

from kneeswarm.analysis.schema.summary import (STEP_EXTRA_KEYS, STEP_KEYS, SUMMARY_VERSION, AnalysisFacts,
                                               EndpointFacts, HostFacts, Knee, LoadFacts, PlanTable, ServerMetrics,
                                               Summary, SummaryStep, TargetSeries, Totals, WorkerTotals,
                                               WorkloadFacts, summary_meta)

import json
import logging
import math
from typing import Any, cast

import numpy as np
import pandas as pd

from kneeswarm.analysis.measure.loop import step_load_keys
from kneeswarm.analysis.measure.problems import Problems, collect
from kneeswarm.analysis.measure.serverstats import energy_per_request
from kneeswarm.analysis.measure.streaming import (step_keys as streaming_keys)
from kneeswarm.contracts.rundir import Meta

logger = logging.getLogger(__name__)

























def jsonable(x: Any) -> Any:
    """Plain JSON types; NaN/inf -> None; numpy scalars -> Python; tuples -> lists."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, np.ndarray, pd.Series)):
        return [jsonable(v) for v in list(x)]
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        f = float(x)
        if not math.isfinite(f):
            return None
        return f
    if x is None or isinstance(x, str):
        return x
    if x is pd.NA or x is pd.NaT:
        return None
    return str(x)


def _users(v: Any) -> int | float | None:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return None
    f = float(v)
    return int(f) if f.is_integer() else f


def step_records(stats: pd.DataFrame, server: list[dict[str, ServerMetrics]] | None = None,
                 gen_cpu: list[dict[str, float]] | None = None, load: LoadFacts | None = None,
                 streaming: bool = False) -> list[SummaryStep]:
    """One summary step per stats row; ``load``: kneeswarm.analysis.measure.loop.load_facts (rate, items/s);
    ``streaming``: the run streamed (kneeswarm.analysis.measure.streaming keys on every step)."""
    records = []
    for i, row in enumerate(stats.to_dict("records")):
        rec = cast(SummaryStep, {k: row.get(k) for k in STEP_KEYS})  # a row of the stats frame: its columns
        rec["index"] = _users(rec["index"])
        rec["users"] = _users(rec["users"])
        rec["requests"] = int(rec["requests"] or 0)
        rec["errors"] = dict(rec["errors"] or {})
        rec["reasons"] = list(rec["reasons"] or [])
        rec["valid"] = bool(rec["valid"])
        rec.update(cast(SummaryStep, {k: row.get(k) for k in STEP_EXTRA_KEYS}))
        rec["t_end"] = row.get("t_end_used", row.get("t_end"))  # t_end, or where a crashed step was cut
        rec["t_end_recorded"] = row.get("t_end") is not None and math.isfinite(float(row.get("t_end")))
        rec["generator"] = {"cpu_pct": dict(gen_cpu[i])} if gen_cpu and gen_cpu[i] else {}
        rec["server"] = server[i] if server else {}
        for key, count in (("energy_j_per_request", row.get("ok")), ("energy_j_per_token", row.get("tokens_out"))):
            energy = energy_per_request(rec["server"], count, row.get("window_s"))  # J per request (or token)
            if energy is not None:
                rec[key] = energy  # type: ignore[literal-required]  # one of the two energy keys
        rec.update(step_load_keys(rec["users"], rec.get("qps"), load or LoadFacts()))
        rec.update(cast(SummaryStep, streaming_keys(row, streaming)))  # their keys: STREAMING_STEP_KEYS
        if row.get("resent"):
            rec["resent"] = int(row["resent"])
        records.append(rec)
    return records


def build_summary(*, run_id: str, meta: Meta, settings: AnalysisFacts, steps: list[SummaryStep],
                  knee: Knee, latency_knee: Knee, peak: Knee,
                  totals: Totals, hosts: dict[str, HostFacts], workers: dict[str, WorkerTotals],
                  target_series: dict[str, dict[str, TargetSeries]] | None = None, problems: Problems | None = None,
                  **extra: Any) -> Summary:
    """The summary dict (JSON-ready).  ``problems`` (kneeswarm.analysis.measure.problems.collect) gives ``complete``,
    ``warnings`` and ``lost``; ``extra`` keyword arguments become further top-level keys."""
    problems = problems or collect(meta)
    summary: Summary = {
        "summary_version": SUMMARY_VERSION,
        "run_id": run_id,
        "complete": problems.complete,
        "warnings": problems.warnings,
        "lost": problems.lost,
        "ended": meta.get("ended"),
        "meta": summary_meta(meta),
        "analysis": settings,
        "steps": steps,
        "knee": knee,
        "latency_knee": latency_knee,
        "peak": peak,
        "totals": totals,
        "hosts": hosts,
        "target_series": target_series or {},
        "workers": workers,
    }
    summary.update(cast(Summary, extra))  # further keys, each declared in Summary
    return cast(Summary, jsonable(summary))


def to_json(summary: Summary) -> str:
    """Strict JSON (raises rather than write NaN)."""
    return json.dumps(jsonable(summary), indent=2, allow_nan=False) + "\n"










def workload_facts(plan: PlanTable) -> WorkloadFacts:
    """``workload`` {inputs, token_counts} of an OpenAI run's plan: where prompts came from and how
    their tokens were counted (a tokenizer file, or the word approximation); {} for other protocols."""
    request = got if isinstance(got := plan.get("request"), dict) else {}
    if plan.get("protocol") != "openai":
        return {}
    inputs = next((f"{k} {request[k]}" for k in ("replay", "dataset") if request.get(k)), None)
    inputs = inputs or ("lengths" if request.get("lengths") else "synthetic prompts")
    tok = request.get("tokenizer")
    return {"inputs": inputs, "token_counts": f"tokenizer {tok}" if tok else "words (approximation)"}


def endpoint_facts(plan: PlanTable) -> EndpointFacts:
    """``endpoint``: how the target was reached (the plan's [endpoint]).  ``tls`` is "verified"
    (the server's certificate checked, against ``ca_bundle`` or the system's CAs), "unverified"
    (``verify = false``: nothing checked) or None (http://); ``headers`` names the headers sent
    (never their values)."""
    e = got if isinstance(got := plan.get("endpoint"), dict) else {}
    https = str(plan.get("target", "")).startswith("https://")
    return {"scheme": "https" if https else "http",
            "tls": ("verified" if e.get("verify", True) else "unverified") if https else None,
            "ca_bundle": e.get("ca_bundle"), "client_cert": bool(e.get("client_cert")),
            "headers": sorted([*(e.get("headers") or {}), *(e.get("headers_env") or {})]),
            "base_path": e.get("base_path"), "server_name": e.get("server_name")}





































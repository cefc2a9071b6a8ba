"""A traffic mix's figures per class: each class's steps (summary.json ``mix``).

A run with ``[[request.classes]]`` records each request's class (the run directory's ``class``
column).  Each class gets, per step, what the whole gets (QPS, P50/P95/P99, errors; TTFT, ITL,
TPOT and tokens/s where its answers streamed or counted tokens; goodput against the plan's
``[sla]``) over the same steady window as the whole's step; its own knees are
kneeswarm.analysis.summary.classes's.  Rows of a run without the column (older
runs) or without a mix have no class: no ``mix`` section.

The rows are read again here, the few columns needed, part by part, and kept per class and step
as arrays (the findings of a mix resample them: kneeswarm.analysis.findings.mix; so do each
class's knee intervals: kneeswarm.analysis.summary.classes).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from kneeswarm.analysis.schema.summary import ClassFigures, ClassStep
from kneeswarm.contracts.rundir import REQUEST_SCHEMA, RunDir

logger = logging.getLogger(__name__)

COLUMNS = ("t_start", "latency_ms", "ttft_ms", "tokens_out", "ok", "error", "itl_ms", "class")


@dataclass
class ClassRows:
    """One class's rows in one step's steady window, as arrays."""

    latency_ok: np.ndarray  # latencies of its answered requests, ms
    ok: np.ndarray  # bool per row
    ttft_ok: np.ndarray
    tokens_ok: np.ndarray
    itl: np.ndarray  # every inter-token gap of its answered streams
    errors: dict[str, int] = field(default_factory=dict)
    t_ok: np.ndarray = field(default_factory=lambda: np.empty(0))  # start times of its answered requests (s)


def read_class_rows(run: RunDir) -> pd.DataFrame | None:
    """The rows' columns a mix needs, or None when no row has a class."""
    tables = []
    for part in run.request_parts():
        try:
            t = pq.read_table(part, columns=list(COLUMNS), schema=REQUEST_SCHEMA)
        except Exception as e:  # an unreadable part is the whole's warning already (requestscan)
            logger.debug("mix: %s unreadable (%s)", part, e)
            continue
        if t.column("class").null_count < t.num_rows:
            tables.append(t.to_pandas())
    if not tables:
        return None
    df = pd.concat(tables, ignore_index=True)
    return df.loc[df["class"].notna()].reset_index(drop=True)


def split(rows: pd.DataFrame, stats: pd.DataFrame) -> dict[str, list[ClassRows]]:
    """{class: [its rows in each step's steady window, in the order of ``stats``]}."""
    out: dict[str, list[ClassRows]] = {}
    names = sorted(rows["class"].unique())
    t = rows["t_start"].to_numpy(dtype=float)
    for lo, hi in zip(stats["t_lo"].to_numpy(dtype=float), stats["t_hi"].to_numpy(dtype=float)):
        window = rows.loc[(t >= lo) & (t < hi)]
        for name in names:
            r = window.loc[window["class"] == name]
            ok = r["ok"].fillna(False).to_numpy(dtype=bool)
            good = r.loc[ok]
            itl = [np.asarray(g, dtype=float) for g in good["itl_ms"] if g is not None and len(g)]
            out.setdefault(name, []).append(ClassRows(
                latency_ok=good["latency_ms"].to_numpy(dtype=float), ok=ok,
                ttft_ok=pd.to_numeric(good["ttft_ms"], errors="coerce").to_numpy(dtype=float),
                tokens_ok=pd.to_numeric(good["tokens_out"], errors="coerce").to_numpy(dtype=float),
                itl=np.concatenate(itl) if itl else np.empty(0),
                errors={str(k): int(v) for k, v in r.loc[~ok, "error"].fillna("other").value_counts().items()},
                t_ok=good["t_start"].to_numpy(dtype=float)))
    return out


def _p(values: np.ndarray, q: float) -> float | None:
    v = values[np.isfinite(values)]
    return float(np.percentile(v, q)) if len(v) else None


def class_step(rows: ClassRows, step_n: int, step_ok: int, window_s: float, sla: dict[str, float]) -> ClassStep:
    """One class's figures in one step (``step_n``, ``step_ok``: all classes' rows and answers)."""
    n, n_ok = len(rows.ok), int(rows.ok.sum())
    lat, ttft, tok = rows.latency_ok, rows.ttft_ok, rows.tokens_ok
    tpot = (lat - ttft) / (tok - 1) if len(tok) else np.empty(0)
    tpot = tpot[np.isfinite(tpot) & (tok > 1)] if len(tpot) else tpot
    out: ClassStep = {
        "requests": n, "ok": n_ok, "qps": n_ok / window_s if window_s > 0 else None,
        "share_sent": n / step_n if step_n else None, "share_answered": n_ok / step_ok if step_ok else None,
        "p50_ms": _p(lat, 50), "p95_ms": _p(lat, 95), "p99_ms": _p(lat, 99),
        "error_rate": (n - n_ok) / n if n else None, "errors": rows.errors,
        "ttft_p99_ms": _p(ttft, 99), "itl_p99_ms": _p(rows.itl, 99), "tpot_p99_ms": _p(tpot, 99),
        "tokens_s": float(np.nansum(tok)) / window_s if window_s > 0 and np.isfinite(tok).any() else None,
    }
    if sla:
        met = np.ones(len(lat), dtype=bool)
        if "p99_ms" in sla:
            met &= lat <= sla["p99_ms"]
        if "ttft_ms" in sla:
            met &= ~(ttft > sla["ttft_ms"])  # not streamed (NaN): not limited by TTFT
        out["goodput_rps"] = int(met.sum()) / window_s if window_s > 0 else None
    return out


def class_figures(by_class: dict[str, list[ClassRows]], stats: pd.DataFrame, weights: dict[str, float],
                  sla: dict[str, float]) -> list[ClassFigures]:
    """Every class's steps (its knees are added by kneeswarm.analysis.summary.classes)."""
    step_n = [sum(len(by_class[c][i].ok) for c in by_class) for i in range(len(stats))]
    step_ok = [sum(int(by_class[c][i].ok.sum()) for c in by_class) for i in range(len(stats))]
    total = sum(step_n) or 1
    classes: list[ClassFigures] = []
    for name, rows in by_class.items():
        steps: list[ClassStep] = []
        for i, (r, srow) in enumerate(zip(rows, stats.to_dict("records"))):
            step = class_step(r, step_n[i], step_ok[i], float(srow["t_hi"]) - float(srow["t_lo"]), sla)
            users = float(srow["users"])
            step["index"], step["valid"] = int(srow["index"]), bool(srow.get("valid", True))
            step["users"] = int(users) if users.is_integer() else users
            steps.append(step)
        n = sum(len(r.ok) for r in rows)
        classes.append({"name": name, "weight_share": weights.get(name), "requests": n, "share": n / total,
                        "steps": steps})
    return classes


#: per-model request counters of the servers that label them by model: Triton, TorchServe, vLLM, KServe's
#: model server (its predict histogram's count), TF Serving (its count per status: only status="OK", the
#: answered ones, is counted; FAILED_STATUS)
SERVER_COUNTERS = re.compile(r'^(nv_inference_request_success|ts_inference_requests_total|vllm:request_success_total'
                             r'|request_predict_seconds_count|:tensorflow:serving:request_count)'
                             r'\{(?:.*,)?(?:model|model_name)="(?P<model>[^"]*)"')
FAILED_STATUS = re.compile(r'[{,]status="(?!OK")')


def server_rates(prometheus: pd.DataFrame | None, models: dict[str, str], stats: pd.DataFrame) -> dict[str, list[float | None]]:
    """{class: per step, the server's own requests/s of the class's model} from the scraped
    /metrics (hosts/<host>/prometheus.csv: t and one column per sample), each counter's increase
    over the step's steady window (interpolated at its ends) over its length; a class whose
    model no counter names is left out."""
    if prometheus is None or prometheus.empty or "t" not in prometheus.columns:
        return {}
    t = prometheus["t"].to_numpy(dtype=float)
    by_model: dict[str, list[str]] = {}
    for col in prometheus.columns:
        if (m := SERVER_COUNTERS.match(str(col))) is not None and not FAILED_STATUS.search(str(col)):
            by_model.setdefault(m.group("model"), []).append(str(col))
    out: dict[str, list[float | None]] = {}
    for name, model in models.items():
        cols = by_model.get(model)
        if not cols or len(t) < 2:
            continue
        counts = prometheus[cols].apply(pd.to_numeric, errors="coerce").sum(axis=1, min_count=1).to_numpy(dtype=float)
        rates: list[float | None] = []
        for lo, hi in zip(stats["t_lo"].to_numpy(dtype=float), stats["t_hi"].to_numpy(dtype=float)):
            inside = lo >= t[0] and hi <= t[-1] and hi > lo
            rates.append(float((np.interp(hi, t, counts) - np.interp(lo, t, counts)) / (hi - lo)) if inside else None)
        out[name] = rates
    return out


def class_models(plan: dict[str, object]) -> dict[str, str]:
    """{class: the model its requests name} from a run's plan.toml (the class's, else [request]'s)."""
    request = plan.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("classes"), list):
        return {}
    default = str(request.get("model", "demo"))
    return {str(t.get("name")): str(t.get("model", default)) for t in request["classes"] if isinstance(t, dict)}


def plan_weights(plan: dict[str, object]) -> dict[str, float]:
    """{class: its weight's share} from a run's plan.toml (read back as a dict)."""
    request = plan.get("request")
    tables = request.get("classes") if isinstance(request, dict) else None
    if not isinstance(tables, list):
        return {}
    w = {str(t.get("name")): float(t.get("weight", 1.0)) for t in tables if isinstance(t, dict)}
    total = sum(w.values())
    return {k: v / total for k, v in w.items()} if total > 0 else {}


def sla_limits(plan: dict[str, object]) -> dict[str, float]:
    """The [sla] limits a request is judged by for goodput: p99_ms and ttft_ms, where set."""
    sla = plan.get("sla")
    if not isinstance(sla, dict):
        return {}
    return {k: float(v) for k in ("p99_ms", "ttft_ms") if isinstance(v := sla.get(k), (int, float))}

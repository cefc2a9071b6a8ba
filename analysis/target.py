"""Target metrics: the inference server's own /metrics (the article's "saturation" group).

The load side scrapes the server's Prometheus endpoint (the conductor's scraper, on the
master's clock); collectors.prometheus turns the scrapes into ``hosts/<host>/prometheus.csv``
(``hosts/target/`` by default, rundir.TARGET_HOST): ``t`` plus one column per series, keyed
``name`` or ``name{label="v",...}`` (counters cumulative, as exposed).  Which host directory
holds it varies (``hosts/target/``, ``hosts/local/`` ...): every host directory is read.

``TARGET_METRICS`` below is the table of well-known series.  For each summary key the
candidates are tried in order and the first one with at least one matching series wins (so
a server exporting an old and a new name of one metric is not counted twice).  A candidate
names series by a regular expression on the sample name (labels left out); all its matching
series are combined at each sample (``sum``, or ``mean`` for ratios such as cache usage).

Kinds, per step over the steady window ``[t_lo, t_hi)``:

* ``gauge``    mean of the combined samples (times ``scale``);
* ``counter``  rate: the increase over the window / seconds between the first and last
  sample in it; a drop is a counter reset (the new value is the increase, as Prometheus
  ``rate()`` does); a series that appears mid-run starts from 0;
* ``ratio``    increase of a numerator counter / increase of a denominator counter, e.g. the
  mean queue wait per request = d(queue_wait_seconds_sum) / d(queue_wait_seconds_count).

The per-step result is ``steps[i]["server"][host]["target"] = {key: value}``; which series
each key used is in summary ``target_series[host][key]``.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
import pandas as pd

logger = logging.getLogger(__name__)

PROMETHEUS_STREAM = "prometheus"
MIN_COUNTER_SAMPLES = 2  # a rate needs a first and a last sample inside the window


@dataclass(frozen=True)
class Candidate:
    """One server's spelling of a metric: regex(es) on the sample name, without labels."""

    server: str
    pattern: str
    denominator: str | None = None  # for kind "ratio": the counter divided by


@dataclass(frozen=True)
class TargetMetric:
    key: str  # summary key under steps[i]["server"][host]["target"]
    label: str  # human name (table and timeline)
    kind: str  # "gauge" | "counter" | "ratio"
    candidates: tuple[Candidate, ...]
    combine: str = "sum"  # how the matching series of one sample are combined: "sum" | "mean"
    scale: float = 1.0  # multiply the result (fractions -> %, seconds -> ms, us -> ms)


# The table of well-known series.  Sources: the kneeswarm demo target (kneeswarm/target),
# vLLM (docs "Production Metrics"; vllm:gpu_cache_usage_perc is V0, kv_cache_usage_perc V1,
# both fractions 0..1), Triton (docs "Metrics": nv_inference_* counters in us), TorchServe
# (ts_* Prometheus metrics; QueueTime is a gauge in ms), TGI (tgi_queue_size), SGLang.
TARGET_METRICS: tuple[TargetMetric, ...] = (
    TargetMetric("queue_length", "queue", "gauge", (
        Candidate("kneeswarm", r"kneeswarm_target_queue_length"),
        Candidate("vllm", r"vllm:num_requests_waiting"),
        Candidate("triton", r"nv_inference_pending_request_count"),
        Candidate("tgi", r"tgi_queue_size"),
        Candidate("sglang", r"sglang:num_queue_reqs"),
    )),
    TargetMetric("in_flight", "in flight", "gauge", (
        Candidate("kneeswarm", r"kneeswarm_target_inflight"),
        Candidate("vllm", r"vllm:num_requests_running"),
        Candidate("tgi", r"tgi_batch_current_size"),
        Candidate("sglang", r"sglang:num_running_reqs"),
    )),
    TargetMetric("rejected_s", "rejections/s", "counter", (
        Candidate("kneeswarm", r"kneeswarm_target_rejected_total"),
    )),
    TargetMetric("preempted_s", "preemptions/s", "counter", (
        Candidate("vllm", r"vllm:num_preemptions_total"),
    )),
    TargetMetric("kv_cache_usage_pct", "KV cache %", "gauge", (
        Candidate("vllm", r"vllm:kv_cache_usage_perc"),
        Candidate("vllm", r"vllm:gpu_cache_usage_perc"),
        Candidate("sglang", r"sglang:token_usage"),
    ), combine="mean", scale=100.0),
    TargetMetric("queue_wait_ms", "queue wait ms", "ratio", (
        Candidate("kneeswarm", r"kneeswarm_target_queue_wait_seconds_sum",
                  r"kneeswarm_target_queue_wait_seconds_count"),
        Candidate("vllm", r"vllm:request_queue_time_seconds_sum", r"vllm:request_queue_time_seconds_count"),
    ), scale=1000.0),
    TargetMetric("queue_time_us_s", "queue us/s", "counter", (
        # cumulative microseconds spent queued: its rate / 1e6 is the mean number queued (Little)
        Candidate("triton", r"nv_inference_queue_duration_us"),
        Candidate("torchserve", r"ts_queue_latency_microseconds"),
    )),
    TargetMetric("queue_time_ms", "queue time ms", "gauge", (
        Candidate("torchserve", r"QueueTime|ts_queue_time_ms"),
    ), combine="mean"),
    TargetMetric("requests_s", "server req/s", "counter", (
        Candidate("kneeswarm", r"kneeswarm_target_requests_total"),
        Candidate("vllm", r"vllm:request_success_total"),
        Candidate("triton", r"nv_inference_request_success"),
        Candidate("torchserve", r"ts_inference_requests_total"),
    )),
)
TARGET_KEYS = tuple(m.key for m in TARGET_METRICS)


def base_name(series: str) -> str:
    """The sample name of a series key: ``name{a="1"}`` -> ``name``."""
    return series.split("{", 1)[0]


def _matching(columns: Iterable[str], pattern: str | None) -> list[str]:
    if not pattern:
        return []
    rx = re.compile(pattern)
    return [c for c in columns if c != "t" and rx.fullmatch(base_name(c))]


@dataclass(frozen=True)
class Resolved:
    """A TargetMetric bound to the series of one prometheus.csv."""

    metric: TargetMetric
    server: str
    series: tuple[str, ...]
    denominator: tuple[str, ...] = ()


def resolve(columns: Iterable[str]) -> list[Resolved]:
    """For each TARGET_METRICS entry, the first candidate whose series are present."""
    cols = list(columns)
    out = []
    for m in TARGET_METRICS:
        for c in m.candidates:
            num = _matching(cols, c.pattern)
            den = _matching(cols, c.denominator)
            if num and (m.kind != "ratio" or den):
                out.append(Resolved(m, c.server, tuple(num), tuple(den)))
                break
    return out


def wanted_columns(columns: Iterable[str]) -> list[str]:
    """The columns of a prometheus.csv header that TARGET_METRICS uses (plus ``t``)."""
    cols = list(columns)
    keep = {s for r in resolve(cols) for s in (*r.series, *r.denominator)}
    return ["t", *[c for c in cols if c in keep]]


# -- combining series ---------------------------------------------------------------------------
def _numeric(df: pd.DataFrame, cols: Iterable[str]) -> pd.DataFrame:
    return df[list(cols)].apply(pd.to_numeric, errors="coerce")


def gauge_values(df: pd.DataFrame, r: Resolved) -> np.ndarray:
    """The combined gauge per sample (NaN where no series had a value), times scale."""
    data = _numeric(df, r.series)
    v = data.sum(axis=1, min_count=1) if r.metric.combine == "sum" else data.mean(axis=1)
    return v.to_numpy(dtype=float) * r.metric.scale


def counter_cumulative(df: pd.DataFrame, cols: Iterable[str]) -> np.ndarray:
    """The summed, reset-corrected increase since the first sample (0 at the first sample)."""
    data = _numeric(df, cols).ffill().fillna(0.0).to_numpy(dtype=float)
    if not len(data):
        return np.empty(0)
    inc = np.diff(data, axis=0)
    reset = inc < 0
    inc[reset] = data[1:][reset]  # after a reset the counter restarted from 0
    return np.concatenate([[0.0], inc.sum(axis=1).cumsum()])


def window_rates(t: np.ndarray, cum: np.ndarray, t_lo: np.ndarray, t_hi: np.ndarray) -> np.ndarray:
    """Per window: (cum[last] - cum[first]) / (t[last] - t[first]) over samples in [t_lo, t_hi)."""
    a = np.searchsorted(t, t_lo, side="left")
    b = np.searchsorted(t, t_hi, side="left") - 1
    out = np.full(len(t_lo), np.nan)
    ok = b - a + 1 >= MIN_COUNTER_SAMPLES
    dt = np.zeros(len(t_lo))
    dt[ok] = t[b[ok]] - t[a[ok]]
    ok &= dt > 0
    out[ok] = (cum[b[ok]] - cum[a[ok]]) / dt[ok]
    return out


def window_increase(t: np.ndarray, cum: np.ndarray, t_lo: np.ndarray, t_hi: np.ndarray) -> np.ndarray:
    """Per window: cum[last] - cum[first] over samples in [t_lo, t_hi) (NaN with < 2 samples)."""
    a = np.searchsorted(t, t_lo, side="left")
    b = np.searchsorted(t, t_hi, side="left") - 1
    out = np.full(len(t_lo), np.nan)
    ok = b - a + 1 >= MIN_COUNTER_SAMPLES
    out[ok] = cum[b[ok]] - cum[a[ok]]
    return out


def window_gauge_means(t: np.ndarray, v: np.ndarray, t_lo: np.ndarray, t_hi: np.ndarray) -> np.ndarray:
    """Per window: mean of the finite values whose t is in [t_lo, t_hi) (vectorised cumsums)."""
    fin = np.isfinite(v)
    cs = np.concatenate([[0.0], np.cumsum(np.where(fin, v, 0.0))])
    cn = np.concatenate([[0], np.cumsum(fin)])
    a = np.searchsorted(t, t_lo, side="left")
    b = np.searchsorted(t, t_hi, side="left")
    n = cn[b] - cn[a]
    out = np.full(len(t_lo), np.nan)
    ok = n > 0
    out[ok] = (cs[b] - cs[a])[ok] / n[ok]
    return out


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    df["t"] = pd.to_numeric(df["t"], errors="coerce")
    return df.dropna(subset=["t"]).sort_values("t", kind="stable").reset_index(drop=True)


def target_windows(df: pd.DataFrame | None, t_lo: np.ndarray, t_hi: np.ndarray) -> list[dict[str, float]]:
    """Per window: {target key: value} for the metrics present in one prometheus table."""
    n = len(t_lo)
    if df is None or df.empty or "t" not in df.columns:
        return [{} for _ in range(n)]
    df = _sorted(df)
    t = df["t"].to_numpy(dtype=float)
    t_lo, t_hi = np.asarray(t_lo, dtype=float), np.asarray(t_hi, dtype=float)
    cols: dict[str, np.ndarray] = {}
    for r in resolve(df.columns):
        m = r.metric
        if m.kind == "gauge":
            cols[m.key] = window_gauge_means(t, gauge_values(df, r), t_lo, t_hi)
        elif m.kind == "counter":
            cols[m.key] = window_rates(t, counter_cumulative(df, r.series), t_lo, t_hi) * m.scale
        else:  # ratio
            num = window_increase(t, counter_cumulative(df, r.series), t_lo, t_hi)
            den = window_increase(t, counter_cumulative(df, r.denominator), t_lo, t_hi)
            with np.errstate(all="ignore"):
                cols[m.key] = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan) * m.scale
    return [{k: float(v[i]) for k, v in cols.items() if np.isfinite(v[i])} for i in range(n)]


def target_series_used(df: pd.DataFrame | None) -> dict[str, dict[str, Any]]:
    """{key: {label, kind, server, series[, denominator]}}: which series each target key used."""
    if df is None or df.empty:
        return {}
    out = {}
    for r in resolve(df.columns):
        d: dict[str, Any] = {"label": r.metric.label, "kind": r.metric.kind, "server": r.server,
                             "series": list(r.series)}
        if r.denominator:
            d["denominator"] = list(r.denominator)
        out[r.metric.key] = d
    return out


def target_timeline(df: pd.DataFrame | None, t0: float, bin_s: float) -> pd.DataFrame:
    """Per bin (seconds since t0): gauges averaged, counters as per-second rates (mean of the
    per-interval rates ending in the bin), ratios as the bin's increases divided."""
    if df is None or df.empty or "t" not in df.columns:
        return pd.DataFrame(columns=["t"])
    df = _sorted(df)
    t = df["t"].to_numpy(dtype=float)
    data: dict[str, np.ndarray] = {}
    for r in resolve(df.columns):
        m = r.metric
        if m.kind == "gauge":
            data[m.key] = gauge_values(df, r)
        elif m.kind == "counter" and len(t) >= 2:
            cum = counter_cumulative(df, r.series)
            with np.errstate(all="ignore"):
                rate = np.diff(cum) / np.diff(t) * m.scale
            data[m.key] = np.concatenate([[np.nan], rate])
    bins = np.floor((t - t0) / bin_s).astype(np.int64)
    ratios: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for r in resolve(df.columns):
        if r.metric.kind == "ratio" and len(t) >= 2:
            num = np.diff(counter_cumulative(df, r.series), prepend=0.0)
            den = np.diff(counter_cumulative(df, r.denominator), prepend=0.0)
            ratios[r.metric.key] = (num, den)
    if not data and not ratios:
        return pd.DataFrame(columns=["t"])
    out = pd.DataFrame(data).assign(bin=bins).groupby("bin").mean()
    for key, (num, den) in ratios.items():
        sums = pd.DataFrame({"num": num, "den": den, "bin": bins}).groupby("bin").sum()
        scale = next(m.scale for m in TARGET_METRICS if m.key == key)
        out[key] = (sums["num"] / sums["den"].where(sums["den"] > 0)) * scale
    out = out.reset_index()
    out["t"] = out["bin"] * bin_s
    return out

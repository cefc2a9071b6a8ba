"""Target metrics: the inference server's own /metrics (the article's "saturation" group).

The load side scrapes the server's Prometheus endpoint (the conductor's scraper, on the
master's clock); kneeswarm.collectors.prometheus turns the scrapes into ``hosts/<host>/prometheus.csv``
(``hosts/target/`` by default, rundir.TARGET_HOST): ``t`` plus one column per series, keyed
``name`` or ``name{label="v",...}`` (counters cumulative, as exposed).  Which host directory
holds it varies (``hosts/target/``, ``hosts/local/`` ...): every host directory is read.

``TARGET_METRICS`` below is the table of well-known series.  For each summary key the
candidates are tried in order and the first one with at least one matching series wins (so
a server exporting an old and a new name of one metric is not counted twice).  A candidate
names series by a regular expression on the sample name (labels left out); all its matching
series are combined at each sample (``sum``, or ``mean`` for ratios such as cache usage).

Kinds, per step over the steady window ``[t_lo, t_hi)``:

* ``gauge``    mean of the combined samples (times ``scale``) -- or, for a candidate whose gauge
  flickers rather than holds a level (``step=PEAK``: llama-server's ``requests_deferred``, see
  LLAMACPP_DEFERRED), the highest combined sample;
* ``counter``  rate: the increase over the window / seconds between the first and last
  sample in it; a drop is a counter reset (the new value is the increase, as Prometheus
  ``rate()`` does); a series that appears mid-run starts from 0;
* ``ratio``    increase of a numerator counter / increase of a denominator counter, e.g. the
  mean queue wait per request = d(queue_wait_seconds_sum) / d(queue_wait_seconds_count).

A candidate may also filter on labels (``labels``) and convert its server's unit (``scale``,
e.g. Triton's microseconds to seconds).  Each candidate says where its names come from:
``source`` "scrape" (seen in a recorded real /metrics of that server, stored under
tests/fixtures/scrapes/ with how it was recorded) or "docs" (the server's documentation or
source file, named in ``ref``) -- vLLM, TGI and SGLang need a GPU and model weights and could
not be run here; the demo target, KServe, TorchServe and Triton were.

The per-step result is ``steps[i]["server"][host]["target"] = {key: value}``; which series
each key used, whose naming they follow and where those names come from is in summary
``target_series[host][key]`` ({label, kind, server, source, ref, series[, denominator][, step]}; a
gauge's ``step`` is "mean" or "peak"); :func:`source_lines` words it for the report.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from functools import partial
from typing import Any, Iterable

from kneeswarm.analysis.schema.summary import Summary, TargetSeries

import numpy as np
import pandas as pd

logger = logging.getLogger(__name__)

PROMETHEUS_STREAM = "prometheus"
MIN_COUNTER_SAMPLES = 2  # a rate needs a first and a last sample inside the window


SCRAPE = "scrape"  # the names were seen in a recorded real /metrics of that server (tests/fixtures/scrapes/)
DOCS = "docs"  # the names come from the server's documentation or source (named in ``ref``)
FIXTURES = "tests/fixtures/scrapes/"
MEAN = "mean"  # a gauge's step figure: the mean of its samples in the window (a level)
PEAK = "peak"  # ... its highest sample: a gauge that reads its level only some of the time (LLAMACPP_DEFERRED)


@dataclass(frozen=True)
class Candidate:
    """One server's spelling of a metric: regex(es) on the sample name, without labels.

    ``labels`` (optional) is a regex searched in the label part of the series key
    (``{a="1",b="2"}``), for a metric whose meaning lives in a label, e.g. TGI's
    ``tgi_request_failure{err="overloaded"}``; it applies to numerator and denominator.
    ``scale`` converts this server's unit into the metric's base unit (microseconds to
    seconds: 1e-6); the metric's own ``scale`` then makes the shown unit.
    ``source`` says where the names come from (SCRAPE or DOCS) and ``ref`` which fixture or
    documentation page.
    ``step`` (gauges): how a window's samples make its figure, MEAN or PEAK.
    """

    server: str
    pattern: str
    denominator: str | None = None  # for kind "ratio": the counter divided by
    labels: str | None = None
    scale: float = 1.0
    source: str = DOCS
    ref: str = ""
    step: str = MEAN


@dataclass(frozen=True)
class TargetMetric:
    key: str  # summary key under steps[i]["server"][host]["target"]
    label: str  # human name (table and timeline)
    kind: str  # "gauge" | "counter" | "ratio"
    candidates: tuple[Candidate, ...]
    combine: str = "sum"  # how the matching series of one sample are combined: "sum" | "mean"
    scale: float = 1.0  # multiply the result (fractions -> %, seconds -> ms)


# -- where each server's names come from -------------------------------------------------------
# A recorded real scrape where the server could be installed and run here (CPU, no weights, see
# tests/fixtures/scrapes/README.md); otherwise the server's own documentation or source file
# (vLLM, TGI and SGLang need a GPU and model weights; their fixtures are examples written from
# these pages, marked as such in their headers).
KNEESWARM = partial(Candidate, "kneeswarm", source=SCRAPE, ref=FIXTURES + "kneeswarm-0.1.0.txt")
VLLM = partial(Candidate, "vllm", source=DOCS, ref=(
    "vllm-project/vllm vllm/v1/metrics/loggers.py (PrometheusStatLogger); docs.vllm.ai "
    "'Production Metrics'"))
TGI = partial(Candidate, "tgi", source=DOCS, ref=(
    "huggingface/text-generation-inference docs/source/reference/metrics.md; router/src/server.rs "
    "(metrics-exporter-prometheus: counters named as registered, *_duration histograms in seconds)"))
SGLANG = partial(Candidate, "sglang", source=DOCS, ref=(
    "sgl-project/sglang python/sglang/srt/metrics/collector.py (SchedulerMetricsCollector, "
    "TokenizerMetricsCollector)"))
# Triton: recorded from tritonserver 2.51.0 (bundled in nvidia-pytriton, CPU); units and meanings
# from triton-inference-server/server docs/user_guide/metrics.md (per-model counters without _total,
# cumulative latencies in microseconds over successful requests, nv_inference_request_failure{reason}).
TRITON = partial(Candidate, "triton", source=SCRAPE, ref=FIXTURES + "triton-2.51.0.txt")
TORCHSERVE = partial(Candidate, "torchserve", source=SCRAPE, ref=FIXTURES + "torchserve-0.12.0.txt")
KSERVE = partial(Candidate, "kserve", source=SCRAPE, ref=FIXTURES + "kserve-0.21.0.txt")
# llama.cpp's llama-server (--metrics): recorded from the server built from the llama-cpp-python
# 0.3.36 sdist (tests_conformance/, ggml 0.25.3); meanings from tools/server/server-task.cpp
# (server_task_result_metrics::to_metrics).  It counts no requests and no failures.
LLAMACPP = partial(Candidate, "llamacpp", source=SCRAPE, ref=FIXTURES + "llamacpp-0.3.36.txt")
# ... and its KV-cache series, which older builds exported (llamacpp:kv_cache_usage_ratio,
# llamacpp:kv_cache_tokens) and the recorded one no longer does
LLAMACPP_DOCS = partial(Candidate, "llamacpp-old", source=DOCS, ref=(
    "ggml-org/llama.cpp examples/server/server.cpp before mid-2025 (server_task_result_metrics: "
    "kv_cache_usage_ratio, kv_cache_tokens); examples/server/README.md 'GET /metrics'"))
# llama-server's requests_deferred is not a level of the requests waiting for a slot: it is the length
# of the list of tasks put back for want of a slot (server_queue::defer) at the instant of the scrape.
# A waiting task is also found in the task queue itself (pop_deferred_task moves one back each time a
# slot frees, to be deferred again when the main loop finds no slot) and among the tasks set aside
# while a decode runs (queue_tasks_unhandled), neither counted.  So with every slot busy it reads
# anything from 0 to the whole wait, mostly one or the other.  Three runs' scrapes of the 6-user step
# on 4 slots (tests_conformance/test_llamacpp.py), 2 requests waiting the whole step each time:
# 0, 2, 0, 0, 0, 0, 0, 2, 2, 2 (mean 0.8); 2, 2, 2, 2, 0, 0, 2, 2, 2, 2 (1.6); 2, 1, 2, 2, 2, 1, 1, 2,
# 2, 2 (1.7).  A mean under-reads the queue (0.8 is below queue_growing's rise of one) and varies run
# to run; its highest reading is the wait (never more: it counts only waiting tasks), 2 in all three,
# so the step figure is the PEAK -- the highest scrape, said so in the report (source_lines), not a
# measured mean.  The client's count agrees where the wait is steady: requests in flight (Little's L,
# measured from the rows: 5.99) less the mean busy slots (4.00) = 1.99 on the last two runs.  That
# figure was not taken instead: the client's in flight spans every replica behind the URL, and the
# moments a slot is between requests read as waiting (0.1 at 1 user, where nothing waits; peak 0).
LLAMACPP_DEFERRED = LLAMACPP(r"llamacpp:requests_deferred", step=PEAK)

US = 1e-6  # microseconds -> seconds
# Counters exposed without the ``_total`` suffix (Triton, TGI, TorchServe: their exporters are not
# prometheus_client) come out of kneeswarm.collectors.prometheus WITH it: prometheus_client's parser names
# a counter's samples ``<name>_total`` (seen in the TorchServe and Triton scrapes).  Their patterns
# accept both spellings.

# The table of well-known series: for each key, the candidates in order (the first one whose
# series are present wins, so an old and a new name of one metric are never counted twice).
# Ratios of a histogram's _sum/_count are the mean per observation (a mean per request, or per
# token gap for ITL); "seconds" base units are shown in ms (scale 1000).
TARGET_METRICS: tuple[TargetMetric, ...] = (
    TargetMetric("queue_length", "queue", "gauge", (
        KNEESWARM(r"kneeswarm_target_queue_length"),
        VLLM(r"vllm:num_requests_waiting"),
        TRITON(r"nv_inference_pending_request_count"),
        TGI(r"tgi_queue_size"),
        SGLANG(r"sglang:num_queue_reqs"),
        LLAMACPP_DEFERRED,  # requests waiting for a free slot: the step's highest scrape (above)
    )),
    TargetMetric("in_flight", "in flight", "gauge", (
        KNEESWARM(r"kneeswarm_target_inflight"),
        VLLM(r"vllm:num_requests_running"),
        TGI(r"tgi_batch_current_size"),
        SGLANG(r"sglang:num_running_reqs"),
        LLAMACPP(r"llamacpp:requests_processing"),  # busy slots
    )),
    TargetMetric("rejected_s", "rejections/s", "counter", (
        KNEESWARM(r"kneeswarm_target_rejected_total"),
        TGI(r"tgi_request_failure(_total)?", labels=r'err="overloaded"'),  # --max-concurrent-requests hit
        TRITON(r"nv_inference_request_failure(_total)?", labels=r'reason="REJECTED"'),  # queue policy
    )),
    TargetMetric("failures_s", "failures/s", "counter", (
        KNEESWARM(r"kneeswarm_target_requests_total", labels=r'code="[45]\d\d"'),
        TRITON(r"nv_inference_request_failure(_total)?"),
        TGI(r"tgi_request_failure(_total)?"),
        SGLANG(r"sglang:num_aborted_requests_total"),
        TORCHSERVE(r"Requests[45]XX(_total)?"),  # frontend counters by HTTP status class
        # vLLM has no failure counter (request_success{finished_reason="abort"} is a client
        # abort); KServe's Python server counts no failures.
    )),
    TargetMetric("preempted_s", "preemptions/s", "counter", (
        VLLM(r"vllm:num_preemptions_total"),
        SGLANG(r"sglang:num_retracted_requests_total"),  # SGLang's "retract" = vLLM's preemption
    )),
    TargetMetric("kv_cache_usage_pct", "KV cache %", "gauge", (
        VLLM(r"vllm:kv_cache_usage_perc"),  # V1 (0.9+); fraction 0..1
        VLLM(r"vllm:gpu_cache_usage_perc"),  # its deprecated V0 name, same value
        SGLANG(r"sglang:token_usage"),  # fraction of the KV token pool in use
        # llama.cpp before mid-2025 (later builds, such as the recorded 0.3.36 scrape, dropped it): the KV
        # cells in use over the context's cells, 0..1
        LLAMACPP_DOCS(r"llamacpp:kv_cache_usage_ratio"),
    ), combine="mean", scale=100.0),
    TargetMetric("queue_wait_ms", "queue wait ms", "ratio", (
        KNEESWARM(r"kneeswarm_target_queue_wait_seconds_sum", r"kneeswarm_target_queue_wait_seconds_count"),
        VLLM(r"vllm:request_queue_time_seconds_sum", r"vllm:request_queue_time_seconds_count"),
        TGI(r"tgi_request_queue_duration_sum", r"tgi_request_queue_duration_count"),
        SGLANG(r"sglang:queue_time_seconds_sum", r"sglang:queue_time_seconds_count"),
        TRITON(r"nv_inference_queue_duration_us(_total)?", r"nv_inference_request_success(_total)?", scale=US),
        TORCHSERVE(r"ts_queue_latency_microseconds(_total)?", r"ts_inference_requests_total", scale=US),
    ), scale=1000.0),
    TargetMetric("queue_time_us_s", "queue us/s", "counter", (
        # cumulative microseconds spent queued: its rate / 1e6 is the mean number queued (Little)
        TRITON(r"nv_inference_queue_duration_us(_total)?"),
        TORCHSERVE(r"ts_queue_latency_microseconds(_total)?"),
    )),
    TargetMetric("queue_time_ms", "queue time ms", "gauge", (
        TORCHSERVE(r"QueueTime"),  # the last request's queue time (gauge, ms; Level="Host")
    ), combine="mean"),
    TargetMetric("requests_s", "server req/s", "counter", (
        KNEESWARM(r"kneeswarm_target_requests_total"),
        VLLM(r"vllm:request_success_total"),
        TRITON(r"nv_inference_request_success(_total)?"),
        TORCHSERVE(r"ts_inference_requests_total"),
        TGI(r"tgi_request_success(_total)?"),
        SGLANG(r"sglang:num_requests_total"),
        KSERVE(r"request_predict_seconds_count"),  # one predict observation per request
    )),
    TargetMetric("server_latency_ms", "server latency ms", "ratio", (
        KNEESWARM(r"kneeswarm_target_request_duration_seconds_sum",
                  r"kneeswarm_target_request_duration_seconds_count"),
        VLLM(r"vllm:e2e_request_latency_seconds_sum", r"vllm:e2e_request_latency_seconds_count"),
        TGI(r"tgi_request_duration_sum", r"tgi_request_duration_count"),
        SGLANG(r"sglang:e2e_request_latency_seconds_sum", r"sglang:e2e_request_latency_seconds_count"),
        TRITON(r"nv_inference_request_duration_us(_total)?", r"nv_inference_request_success(_total)?", scale=US),
        TORCHSERVE(r"ts_inference_latency_microseconds(_total)?", r"ts_inference_requests_total", scale=US),
    ), scale=1000.0),
    TargetMetric("ttft_ms", "server TTFT ms", "ratio", (
        # TGI exports no TTFT; Triton's nv_inference_first_response_histogram_ms is the first
        # response (chunk) of a decoupled model, not a token, and is left out
        VLLM(r"vllm:time_to_first_token_seconds_sum", r"vllm:time_to_first_token_seconds_count"),
        SGLANG(r"sglang:time_to_first_token_seconds_sum", r"sglang:time_to_first_token_seconds_count"),
    ), scale=1000.0),
    TargetMetric("itl_ms", "server ITL ms", "ratio", (  # mean gap between two output tokens
        VLLM(r"vllm:inter_token_latency_seconds_sum", r"vllm:inter_token_latency_seconds_count"),
        # the older V1 name of the same per-token gap (renamed in vLLM 0.11)
        VLLM(r"vllm:time_per_output_token_seconds_sum", r"vllm:time_per_output_token_seconds_count"),
        SGLANG(r"sglang:inter_token_latency_seconds_sum", r"sglang:inter_token_latency_seconds_count"),
    ), scale=1000.0),
    TargetMetric("tpot_ms", "server TPOT ms", "ratio", (  # per request: its mean time per output token
        VLLM(r"vllm:request_time_per_output_token_seconds_sum",
             r"vllm:request_time_per_output_token_seconds_count"),
        # TGI: inference time / generated tokens of each request (prefill included)
        TGI(r"tgi_request_mean_time_per_token_duration_sum", r"tgi_request_mean_time_per_token_duration_count"),
        # llama.cpp: each slot's generation seconds over the tokens it generated (its timings'
        # predicted_ms / predicted_n, summed over requests)
        LLAMACPP(r"llamacpp:tokens_predicted_seconds_total", r"llamacpp:tokens_predicted_total"),
    ), scale=1000.0),
    TargetMetric("gen_tokens_s", "server gen tok/s", "counter", (
        VLLM(r"vllm:generation_tokens_total"),
        SGLANG(r"sglang:generation_tokens_total"),
        TGI(r"tgi_request_generated_tokens_sum"),  # histogram sum: tokens of finished requests
        LLAMACPP(r"llamacpp:tokens_predicted_total"),
    )),
    TargetMetric("prompt_tokens_s", "server prompt tok/s", "counter", (
        VLLM(r"vllm:prompt_tokens_total"),
        SGLANG(r"sglang:prompt_tokens_total"),
        TGI(r"tgi_request_input_length_sum"),  # histogram sum: prompt tokens of requests
        LLAMACPP(r"llamacpp:prompt_tokens_total"),  # prompt tokens processed, cached ones left out
    )),
    # -- the LLM engine's own state, which the engine findings read: its batch, its queue, its prefix cache
    # Keys of their own, not queue_length/in_flight: a server may export both a request pool's
    # names and an engine's (the demo target: kneeswarm_target_inflight for tensor requests,
    # vllm:num_requests_running for its LLM engine), and the engine findings read the engine's.
    TargetMetric("llm_running", "engine running", "gauge", (
        VLLM(r"vllm:num_requests_running"),  # the continuous batch: sequences in the running set
        SGLANG(r"sglang:num_running_reqs"),
        TGI(r"tgi_batch_current_size"),
        LLAMACPP(r"llamacpp:requests_processing"),  # busy slots
    )),
    TargetMetric("llm_waiting", "engine waiting", "gauge", (
        VLLM(r"vllm:num_requests_waiting"),  # preempted sequences wait here too
        SGLANG(r"sglang:num_queue_reqs"),
        TGI(r"tgi_queue_size"),
        LLAMACPP_DEFERRED,  # the step's highest scrape (LLAMACPP_DEFERRED)
    )),
    TargetMetric("llm_queue_ms", "engine queue ms", "ratio", (  # mean wait to be scheduled, per request
        VLLM(r"vllm:request_queue_time_seconds_sum", r"vllm:request_queue_time_seconds_count"),
        SGLANG(r"sglang:queue_time_seconds_sum", r"sglang:queue_time_seconds_count"),
        TGI(r"tgi_request_queue_duration_sum", r"tgi_request_queue_duration_count"),
    ), scale=1000.0),
    TargetMetric("decode_batch", "sequences per decode", "ratio", (
        # llama.cpp: tokens generated per llama_decode call, its batch (one token per sequence a
        # decode).  Not its n_busy_slots_per_decode gauge: the busy slots at each decode, batched or
        # not, averaged since the server started (never reset): requests of different LoRA adapters
        # are never in one batch, and at 4 users of two adapters the gauge read 3.6 while its
        # decodes held 2.4 sequences (tests_conformance/test_llamacpp_lora.py)
        LLAMACPP(r"llamacpp:tokens_predicted_total", r"llamacpp:n_decode_total"),
    )),
    TargetMetric("prefix_hit_pct", "prefix-cache hit %", "ratio", (
        # vLLM V1: tokens found in the prefix cache / tokens looked up (both counters, in tokens)
        VLLM(r"vllm:prefix_cache_hits_total", r"vllm:prefix_cache_queries_total"),
        # llama.cpp: prompt tokens reused from a slot's cache / all prompt tokens (processed + reused)
        LLAMACPP(r"llamacpp:prompt_tokens_cached_total", r"llamacpp:prompt_tokens(_cached)?_total"),
    ), scale=100.0),
    TargetMetric("prefix_hit_own_pct", "prefix-cache hit % (own)", "gauge", (
        SGLANG(r"sglang:cache_hit_rate"),  # the scheduler's own hit rate over its last interval (0..1)
    ), combine="mean", scale=100.0),
    TargetMetric("gen_throughput", "server gen tok/s (own)", "gauge", (
        SGLANG(r"sglang:gen_throughput"),  # the scheduler's own estimate over its last interval
    )),
    TargetMetric("batch_size", "batch size", "ratio", (  # items per model execution
        KNEESWARM(r"kneeswarm_target_batch_size_sum", r"kneeswarm_target_batch_size_count"),
        TRITON(r"nv_inference_count(_total)?", r"nv_inference_exec_count(_total)?"),
    )),
    TargetMetric("predict_ms", "predict ms", "ratio", (
        KSERVE(r"request_predict_seconds_sum", r"request_predict_seconds_count"),
    ), scale=1000.0),
    TargetMetric("preprocess_ms", "preprocess ms", "ratio", (
        KSERVE(r"request_preprocess_seconds_sum", r"request_preprocess_seconds_count"),
    ), scale=1000.0),
    TargetMetric("postprocess_ms", "postprocess ms", "ratio", (
        KSERVE(r"request_postprocess_seconds_sum", r"request_postprocess_seconds_count"),
    ), scale=1000.0),
)
TARGET_KEYS = tuple(m.key for m in TARGET_METRICS)


def base_name(series: str) -> str:
    """The sample name of a series key: ``name{a="1"}`` -> ``name``."""
    return series.split("{", 1)[0]


def label_text(series: str) -> str:
    """The label part of a series key: ``name{a="1"}`` -> ``{a="1"}`` ("" without labels)."""
    i = series.find("{")
    return series[i:] if i >= 0 else ""


def _matching(columns: Iterable[str], pattern: str | None, labels: str | None = None) -> list[str]:
    if not pattern:
        return []
    rx = re.compile(pattern)
    lrx = re.compile(labels) if labels else None
    return [c for c in columns if c != "t" and rx.fullmatch(base_name(c))
            and (lrx is None or lrx.search(label_text(c)))]


@dataclass(frozen=True)
class Resolved:
    """A TargetMetric bound to the series of one prometheus.csv."""

    metric: TargetMetric
    candidate: Candidate
    series: tuple[str, ...]
    denominator: tuple[str, ...] = ()

    @property
    def server(self) -> str:
        return self.candidate.server

    @property
    def scale(self) -> float:
        """The candidate's unit conversion times the metric's display scale."""
        return self.candidate.scale * self.metric.scale


def resolve(columns: Iterable[str]) -> list[Resolved]:
    """For each TARGET_METRICS entry, the first candidate whose series are present."""
    cols = list(columns)
    out = []
    for m in TARGET_METRICS:
        for c in m.candidates:
            num = _matching(cols, c.pattern, c.labels)
            den = _matching(cols, c.denominator, c.labels)
            if num and (m.kind != "ratio" or den):
                out.append(Resolved(m, c, tuple(num), tuple(den)))
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
    return v.to_numpy(dtype=float) * r.scale


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


def window_gauge_peaks(t: np.ndarray, v: np.ndarray, t_lo: np.ndarray, t_hi: np.ndarray) -> np.ndarray:
    """Per window: the highest finite value whose t is in [t_lo, t_hi) (NaN where none)."""
    a = np.searchsorted(t, t_lo, side="left")
    b = np.searchsorted(t, t_hi, side="left")
    out = np.full(len(t_lo), np.nan)
    for i in range(len(t_lo)):
        w = v[a[i]:b[i]]
        w = w[np.isfinite(w)]
        if len(w):
            out[i] = w.max()
    return out


def window_gauge(r: Resolved, t: np.ndarray, v: np.ndarray, t_lo: np.ndarray, t_hi: np.ndarray) -> np.ndarray:
    """A gauge's figure per window: its mean, or its highest sample for a PEAK candidate."""
    step = window_gauge_peaks if r.candidate.step == PEAK else window_gauge_means
    return step(t, v, t_lo, t_hi)


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
            cols[m.key] = window_gauge(r, t, gauge_values(df, r), t_lo, t_hi)
        elif m.kind == "counter":
            cols[m.key] = window_rates(t, counter_cumulative(df, r.series), t_lo, t_hi) * r.scale
        else:  # ratio
            num = window_increase(t, counter_cumulative(df, r.series), t_lo, t_hi)
            den = window_increase(t, counter_cumulative(df, r.denominator), t_lo, t_hi)
            with np.errstate(all="ignore"):
                cols[m.key] = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan) * r.scale
    return [{k: float(v[i]) for k, v in cols.items() if np.isfinite(v[i])} for i in range(n)]


def target_series_used(df: pd.DataFrame | None) -> dict[str, TargetSeries]:
    """{key: {label, kind, server, source, ref, series[, denominator][, step]}}: which series each
    target key used, whose naming they follow (``server``) and where those names come from
    (``source``: "scrape" = seen in a recorded real scrape, ``ref`` the fixture; "docs" = the
    server's documentation or source, ``ref`` the page); a gauge's ``step``: its step figure is
    the samples' "mean" or their "peak"."""
    if df is None or df.empty:
        return {}
    out: dict[str, TargetSeries] = {}
    for r in resolve(df.columns):
        d: TargetSeries = {"label": r.metric.label, "kind": r.metric.kind, "server": r.server,
                             "source": r.candidate.source, "ref": r.candidate.ref, "series": list(r.series)}
        if r.denominator:
            d["denominator"] = list(r.denominator)
        if r.metric.kind == "gauge":
            d["step"] = r.candidate.step
        out[r.metric.key] = d
    return out


def target_timeline(df: pd.DataFrame | None, t0: float, bin_s: float) -> pd.DataFrame:
    """Per bin (seconds since t0): gauges averaged (a PEAK candidate's: the bin's highest sample),
    counters as per-second rates (mean of the per-interval rates ending in the bin), ratios as the
    bin's increases divided."""
    if df is None or df.empty or "t" not in df.columns:
        return pd.DataFrame(columns=["t"])
    df = _sorted(df)
    t = df["t"].to_numpy(dtype=float)
    data: dict[str, np.ndarray] = {}
    peaks: list[str] = []  # gauges whose bin figure is their highest sample (PEAK), not their mean
    resolved = resolve(df.columns)
    for r in resolved:
        m = r.metric
        if m.kind == "gauge":
            data[m.key] = gauge_values(df, r)
            if r.candidate.step == PEAK:
                peaks.append(m.key)
        elif m.kind == "counter" and len(t) >= 2:
            cum = counter_cumulative(df, r.series)
            with np.errstate(all="ignore"):
                rate = np.diff(cum) / np.diff(t) * r.scale
            data[m.key] = np.concatenate([[np.nan], rate])
    bins = np.floor((t - t0) / bin_s).astype(np.int64)
    ratios: dict[str, tuple[np.ndarray, np.ndarray, float]] = {}
    for r in resolved:
        if r.metric.kind == "ratio" and len(t) >= 2:
            num = np.diff(counter_cumulative(df, r.series), prepend=0.0)
            den = np.diff(counter_cumulative(df, r.denominator), prepend=0.0)
            ratios[r.metric.key] = (num, den, r.scale)
    if not data and not ratios:
        return pd.DataFrame(columns=["t"])
    by_bin = pd.DataFrame(data).assign(bin=bins).groupby("bin")
    out = by_bin.mean()
    for key in peaks:
        out[key] = by_bin[key].max()
    for key, (num, den, scale) in ratios.items():
        sums = pd.DataFrame({"num": num, "den": den, "bin": bins}).groupby("bin").sum()
        out[key] = (sums["num"] / sums["den"].where(sums["den"] > 0)) * scale
    out = out.reset_index()
    out["t"] = out["bin"] * bin_s
    return out


SOURCE_WORDS = {SCRAPE: "from a recorded real scrape", DOCS: "from its documentation"}


def source_lines(used: dict[str, TargetSeries]) -> list[str]:
    """For the report: one line per naming used in a host's ``target_series`` (summary), e.g.
    ``vllm names from its documentation (vllm-project/vllm ...): queue, in flight``; then, where a
    gauge's step figure is its highest sample rather than a mean, a line that says so."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    peaks: list[str] = []
    for key, d in used.items():
        if isinstance(d, dict):
            src = (str(d.get("server", "?")), str(d.get("source", "?")), str(d.get("ref", "")))
            groups.setdefault(src, []).append(str(d.get("label", key)))
            if d.get("step") == PEAK:
                series = d.get("series")
                peaks.append(f"{d.get('label', key)} ({', '.join(map(str, series if isinstance(series, list) else []))})")
    lines = [f"{server} names {SOURCE_WORDS.get(source, source)} ({ref}): {', '.join(labels)}"
             for (server, source, ref), labels in groups.items()]
    if peaks:
        lines.append(f"{'; '.join(peaks)}: each step's highest scrape, not a mean -- the gauge reads the whole "
                     "wait or less from one scrape to the next (analysis/measure/target.py, LLAMACPP_DEFERRED)")
    return lines


def target_source_note(summary: Summary, cols: Iterable[tuple[str, str, str, str]] | None) -> list[str]:
    """:func:`source_lines` for one step-table group (summary.table_groups) when its columns are
    one host's target metrics; [] for any other group."""
    hosts = {c[0] for c in cols or () if str(c[2]).startswith("target.")}
    if len(hosts) != 1:
        return []
    used = (summary.get("target_series") or {}).get(hosts.pop())
    return source_lines(used) if isinstance(used, dict) else []

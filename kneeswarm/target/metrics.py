"""Prometheus metrics of the demo target: the article's server-side "saturation" group.

Every metric lives in the target's own ``CollectorRegistry`` (never the process-global one) and is
served as Prometheus text at ``GET /metrics``. Names:

``kneeswarm_target_requests_total{code}``            counter: infer requests answered, by HTTP
                                                      status code ("200" = served). Exact: one
                                                      increment per infer response sent.
``kneeswarm_target_rejected_total``                  counter: infer requests refused with 503
                                                      because the bounded queue was full.
``kneeswarm_target_inflight``                        gauge: requests executing now (holding a
                                                      request thread in onnx mode, a slot in knee
                                                      mode).
``kneeswarm_target_queue_length``                    gauge: requests waiting for a thread/slot
                                                      (in onnx mode including those a micro-batch
                                                      is still collecting).
``kneeswarm_target_request_duration_seconds``        histogram: time inside the server of each
                                                      served (200) tensor request (KServe v2,
                                                      TorchServe, TF Serving), queueing included.
``kneeswarm_target_queue_wait_seconds``              histogram: time each request waited for a
                                                      thread/slot.
``kneeswarm_target_inference_duration_seconds``      histogram (onnx mode): one ``session.run``.
``kneeswarm_target_batch_size``                      histogram (onnx mode): rows per
                                                      ``session.run`` (above 1 only with
                                                      ``--batch-max`` > 1 or batched requests).
``kneeswarm_target_workers``                         gauge: configured request threads (onnx) or
                                                      slots (knee).
``kneeswarm_target_queue_capacity``                  gauge: configured queue bound, 0 = unbounded.
``kneeswarm_target_info{mode,model,...}``            gauge fixed at 1 whose labels carry the
                                                      configuration.

What the target received and did on purpose (the ground truth of kneeswarm's own tests):

``kneeswarm_target_received_total{protocol,model}``  counter: inference requests accepted for
                                                      parsing, by protocol and requested model.
``kneeswarm_target_received_items_total{protocol}``  counter: items (batch rows) they carried.
``kneeswarm_target_received_inputs_total{protocol,input,datatype,shape}``  counter: each named
                                                      input tensor seen (shape as "4x64").
``kneeswarm_target_auth_total{result}``               counter: requests checked against
                                                      --api-key-env: "ok" or "rejected" (401).
``kneeswarm_target_faults_total{kind}``               counter: faults injected: "fail" (500),
                                                      "reset" (TCP RST, no answer), "truncate"
                                                      (stream cut without [DONE]), "stall"
                                                      (requests held by a stall window),
                                                      "write" (--write-kb: fsynced writes),
                                                      "spin_yield" (--spin-wait: sched_yield
                                                      calls), "model_copy" (sessions opened by
                                                      --model-copy-per-request).

The OpenAI-compatible endpoints also export the names vLLM v1 uses (from vLLM's documentation,
"Production Metrics"), so that a scrape of the demo reads like a scrape of vLLM:
``vllm:num_requests_running``, ``vllm:num_requests_waiting`` (gauges), ``vllm:prompt_tokens_total``,
``vllm:generation_tokens_total``, ``vllm:request_success_total{finished_reason,model_name}`` (counters),
``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds``,
``vllm:e2e_request_latency_seconds`` (histograms, seconds, measured inside the server); with the
engine model (``--kv-tokens``, llmengine.py) also ``vllm:kv_cache_usage_perc`` (gauge, 0..1) and
``vllm:num_preemptions_total`` (counter), ``vllm:request_queue_time_seconds``,
``vllm:request_prefill_time_seconds``, ``vllm:request_decode_time_seconds`` (histograms), and
running/waiting are the engine's batch and queue; with its prefix cache (``--prefix-cache-blocks``)
``vllm:prefix_cache_queries_total`` and ``vllm:prefix_cache_hits_total`` (counters, in tokens).
With LoRA adapters (``--adapters``, lora.py) also ``vllm:lora_requests_info{max_lora,
running_lora_adapters,waiting_lora_adapters}`` (gauge: the time its label set was last current)
and the target's ground truth ``kneeswarm_target_lora_requests_total{adapter}``,
``kneeswarm_target_lora_swaps_total{adapter}``, ``kneeswarm_target_lora_wait_seconds_total{adapter}``.

The KServe v2 endpoint also exports Triton's names (from Triton's documentation, "Metrics"),
labelled ``{model, version}``: ``nv_inference_request_success``, ``nv_inference_request_failure``
(with ``reason``), ``nv_inference_count`` (items), ``nv_inference_exec_count`` (model runs: fewer
than items when requests are batched), and the cumulative microsecond counters
``nv_inference_request_duration_us``, ``nv_inference_queue_duration_us``,
``nv_inference_compute_infer_duration_us`` (the last two cover every protocol's engine work).

The TorchServe endpoint exports TorchServe's frontend names (from TorchServe's metrics API
documentation), labelled ``{model_name, model_version}``: ``ts_inference_requests_total`` and
``ts_inference_latency_microseconds`` (cumulative; ``ts_queue_latency_microseconds`` is not
imitated: the engine's queue is shared by every protocol, see ``nv_inference_queue_duration_us``).
The TF Serving endpoint counts its served requests as TF Serving's Prometheus monitoring does,
``:tensorflow:serving:request_count{model_name, status="OK"}``.  With ``--models`` each of these
per-model counters (and vLLM's ``vllm:request_success_total{model_name}``) counts each model apart.

``*_created`` samples are not exported.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client import CONTENT_TYPE_LATEST as PROMETHEUS_CONTENT_TYPE

logger = logging.getLogger(__name__)

PREFIX = "kneeswarm_target"
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0,
)  # fmt: skip
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128)
FAULT_KINDS = ("fail", "reset", "truncate", "stall")

__all__ = ["PROMETHEUS_CONTENT_TYPE", "TargetMetrics", "TritonCounters"]


class TritonCounters(NamedTuple):
    """Triton's per-model counters (one model's children, or the labelled gauges themselves)."""

    success: Any
    count: Any
    exec: Any
    request_us: Any
    queue_us: Any
    compute_us: Any


class TargetMetrics:
    """The target's metrics, registered in a registry of their own."""

    def __init__(self, info: Mapping[str, str], workers: int, queue_capacity: int) -> None:
        disable_created_metrics()  # the target is its own process; *_created is only noise here
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            f"{PREFIX}_requests",
            "Infer requests answered, by HTTP status code",
            ["code"],
            registry=r,
        )
        for code in ("200", "400", "404", "503"):
            self.requests.labels(code=code)  # export zeros so rates exist from the start
        self.rejected = Counter(
            f"{PREFIX}_rejected", "Infer requests refused with 503: queue full", registry=r
        )
        self.inflight = Gauge(
            f"{PREFIX}_inflight", "Requests executing now (thread or slot held)", registry=r
        )
        self.queue_length = Gauge(
            f"{PREFIX}_queue_length", "Requests waiting for a thread or slot", registry=r
        )
        self.request_duration = Histogram(
            f"{PREFIX}_request_duration_seconds",
            "Time in the server of served infer requests, queueing included",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            f"{PREFIX}_queue_wait_seconds",
            "Time requests waited for a thread or slot",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.inference_duration = Histogram(
            f"{PREFIX}_inference_duration_seconds",
            "Duration of one ONNX Runtime session.run (onnx mode)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            f"{PREFIX}_batch_size",
            "Rows per ONNX Runtime session.run (onnx mode)",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        Gauge(f"{PREFIX}_workers", "Configured request threads or slots", registry=r).set(workers)
        Gauge(
            f"{PREFIX}_queue_capacity", "Configured queue bound, 0 = unbounded", registry=r
        ).set(queue_capacity)
        self._received_metrics(r)
        self._llm_metrics(r)
        self._triton_metrics(r, str(info.get("model", "demo")))
        self._torchserve_metrics(r, str(info.get("model", "demo")))
        labels = {k: str(v) for k, v in info.items()}
        Gauge(f"{PREFIX}_info", "Target configuration", list(labels), registry=r).labels(
            **labels
        ).set(1)

    def _received_metrics(self, r: CollectorRegistry) -> None:
        self.received = Counter(f"{PREFIX}_received", "Inference requests received, by protocol and model",
                                ["protocol", "model"], registry=r)
        self.received_items = Counter(f"{PREFIX}_received_items", "Items (batch rows) received",
                                      ["protocol"], registry=r)
        self.received_inputs = Counter(f"{PREFIX}_received_inputs", "Named input tensors received",
                                       ["protocol", "input", "datatype", "shape"], registry=r)
        self.auth = Counter(f"{PREFIX}_auth", "Requests checked against the API key", ["result"], registry=r)
        self.faults = Counter(f"{PREFIX}_faults", "Faults injected on purpose", ["kind"], registry=r)
        for kind in FAULT_KINDS:
            self.faults.labels(kind=kind)

    def _llm_metrics(self, r: CollectorRegistry) -> None:
        self.llm_running = Gauge("vllm:num_requests_running", "Requests generating tokens now", registry=r)
        self.llm_waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to start", registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens received", registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated", registry=r)
        self.llm_success = Counter("vllm:request_success", "Finished generations", ["finished_reason", "model_name"],
                                   registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token in the server",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Gap between tokens in the server",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Generation time in the server",
                             buckets=LATENCY_BUCKETS, registry=r)
        # the engine model (--kv-tokens, llmengine.py); 0 without it
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 1 = 100 percent", registry=r)
        self.preemptions = Counter("vllm:num_preemptions", "Sequences preempted (recomputed later)", registry=r)
        # the engine model's prefix cache (--prefix-cache-blocks): tokens looked up, tokens found
        self.prefix_queries = Counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                                      registry=r)
        self.prefix_hits = Counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache", registry=r)
        self.queue_time = Histogram("vllm:request_queue_time_seconds", "Time requests waited to be scheduled",
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.prefill_time = Histogram("vllm:request_prefill_time_seconds", "First scheduled to first token",
                                      buckets=LATENCY_BUCKETS, registry=r)
        self.decode_time = Histogram("vllm:request_decode_time_seconds", "First token to last token",
                                     buckets=LATENCY_BUCKETS, registry=r)

    def _triton_metrics(self, r: CollectorRegistry, model: str) -> None:
        names = ("model", "version")

        # Triton (prometheus-cpp) exports these counters without the "_total" that prometheus_client
        # adds to every Counter: gauges that only grow keep Triton's exact sample names.
        def counter(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, list(names), registry=r)

        self._nv = TritonCounters(
            counter("nv_inference_request_success", "Successful inference requests (KServe v2)"),
            counter("nv_inference_count", "Inferences performed: items of successful requests"),
            counter("nv_inference_exec_count", "Model executions (batches run)"),
            counter("nv_inference_request_duration_us", "Cumulative request time, us"),
            counter("nv_inference_queue_duration_us", "Cumulative queue time, us"),
            counter("nv_inference_compute_infer_duration_us", "Cumulative compute time, us"))
        self.nv_failure = Gauge("nv_inference_request_failure", "Failed inference requests (KServe v2)",
                                ["model", "reason", "version"], registry=r)
        one = self.triton(model)
        self.nv_success, self.nv_count, self.nv_exec = one.success, one.count, one.exec
        self.nv_request_us, self.nv_queue_us, self.nv_compute_us = one.request_us, one.queue_us, one.compute_us

    def triton(self, model: str) -> TritonCounters:
        """Triton's per-model counters of ``model`` (version "1"), as Triton labels them: a server of
        several models (``--models``) counts each under its own name."""
        return TritonCounters(*(g.labels(model=model, version="1") for g in self._nv))

    def _torchserve_metrics(self, r: CollectorRegistry, model: str) -> None:
        names = ["model_name", "model_version"]
        self._ts_requests = Counter("ts_inference_requests", "Total number of inference requests (TorchServe)",
                                    names, registry=r)
        # TorchServe exports its cumulative microsecond counters without "_total": growing gauges here.
        self._ts_latency_us = Gauge("ts_inference_latency_microseconds", "Cumulative inference duration in microseconds",
                                    names, registry=r)
        self.ts_requests, self.ts_latency_us = self.torchserve(model)
        # TF Serving's (its Prometheus monitoring config) per-model count, exported as TF Serving does: no "_total"
        self.tf_requests = Gauge(":tensorflow:serving:request_count", "Requests served (TF Serving)",
                                 ["model_name", "status"], registry=r)

    def torchserve(self, model: str) -> tuple[Any, Any]:
        """TorchServe's (requests, cumulative latency us) of ``model``, each model of ``--models`` apart."""
        labels = {"model_name": model, "model_version": "default"}
        return self._ts_requests.labels(**labels), self._ts_latency_us.labels(**labels)

    def enable_lora(self, adapters: list[str], max_lora: int) -> None:
        """LoRA adapters (``--adapters``, lora.py): vLLM's ``vllm:lora_requests_info`` gauge and the
        target's own per-adapter counts, each adapter's at 0 from the start."""
        r = self.registry
        self.lora_info = Gauge("vllm:lora_requests_info", "Running stats on lora requests.",
                               ["max_lora", "waiting_lora_adapters", "running_lora_adapters"], registry=r)
        self.lora_requests = Counter(f"{PREFIX}_lora_requests", "Requests served, by the adapter they named",
                                     ["adapter"], registry=r)
        self.lora_swaps = Counter(f"{PREFIX}_lora_swaps", "Adapters loaded into a slot (first loads included)",
                                  ["adapter"], registry=r)
        self.lora_wait = Counter(f"{PREFIX}_lora_wait_seconds", "Arrival to the adapter ready (waiting, swapping)",
                                 ["adapter"], registry=r)
        for name in adapters:
            for c in (self.lora_requests, self.lora_swaps, self.lora_wait):
                c.labels(adapter=name)
        self.lora_info.labels(max_lora=str(max_lora), waiting_lora_adapters="", running_lora_adapters="")

    def record_received(self, protocol: str, model: str, items: int,
                        inputs: list[tuple[str, str, str]] = ()) -> None:  # type: ignore[assignment]
        """Count one inference request as received: protocol, model, items, (input, datatype, shape)."""
        self.received.labels(protocol=protocol, model=model).inc()
        self.received_items.labels(protocol=protocol).inc(items)
        for name, datatype, shape in inputs:
            self.received_inputs.labels(protocol=protocol, input=name, datatype=datatype, shape=shape).inc()

    def track_queue_length(self, fn: Callable[[], float]) -> None:
        """Read the queue length from ``fn`` at every scrape (exact, nothing to keep in step)."""
        self.queue_length.set_function(fn)

    def track_inflight(self, fn: Callable[[], float]) -> None:
        """Read the number of executing requests from ``fn`` at every scrape."""
        self.inflight.set_function(fn)

    def render(self) -> bytes:
        """The registry in Prometheus text exposition format."""
        return generate_latest(self.registry)

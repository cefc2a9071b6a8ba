"""LLM-engine rules: what the engine's own counters (batch, queue, caches) say about the knee.

They read the target keys of analysis/measure/target.py (the server's /metrics: ``kv_cache_usage_pct``,
``preempted_s``, ``llm_running``, ``llm_waiting``) and the client's streaming percentiles of
analysis/measure/streaming.py (``ttft_p50_ms``, ``tpot_p50_ms``), at the valid steps at and after the knee
against the step before it.  ``unchecked(ctx)`` says, for a streaming run, which of these rules a
host's /metrics could not feed (no such series under any known server's names): the findings
section prints those lines; they are not findings.

``prefix_cache_cold`` reads the workload's shared prefixes (summary ``llm_workload``,
analysis/measure/llmworkload.py) against the server's prefix-cache hit rate (``prefix_hit_pct``).
"""

from __future__ import annotations

import logging
from typing import Mapping, NotRequired, TypedDict

from kneeswarm.analysis.findings.context import Context, as_dict, users_text
from kneeswarm.analysis.schema.summary import Finding, SummaryStep, num
from kneeswarm.analysis.findings.finding import finding
from kneeswarm.analysis.findings.load import LATENCY_RISE

logger = logging.getLogger(__name__)

# kv_cache_full: a step's mean KV-cache usage at or above 80 % while sequences waited or were
# preempted (the cache was the limit, not merely well used; where the server exports neither,
# usage alone).  vLLM preempts only when no block is free (100 %), but a cache is freed a whole
# sequence at a time and a preempted one waits until it fits again, so a full cache's mean over
# 1 Hz scrapes reads below 100 % by up to one sequence's share (measured on the demo target's engine
# model, a 200-token cache holding about 7 sequences of 30 tokens: 80-95 % in 12 steps that preempted
# 5-41 sequences/s, 30-68 % in the steps before it filled).
KV_FULL_PCT = 80.0
# preemption: any preemption at a step at or after the knee, more per second than the step before
# the knee.  vLLM's documentation ("Optimization and Tuning", Preemption): preemption and
# recomputation hurt end-to-end latency; a server that preempts under load needs more KV cache or
# fewer sequences.  A counter is exact, so no floor above zero is needed.
PREEMPTION_MIN_S = 0.0
# queue_growing: the engine's waiting sequences rose by at least one from the knee to the last step
# while its running sequences grew by at most a quarter: the batch stopped growing (full).  The
# quarter absorbs a closed loop's gaps (a finished request's user sends its next one a moment later,
# measured: 3.3-4 running of a 4-sequence batch at the knee).  No published figure.
WAITING_RISE_MIN = 1.0
RUNNING_FLAT_SHARE = 0.25
# prefill_bound / decode_bound: from the step before the knee to the last step, P50 latency rose
# load.py's LATENCY_RISE times, and TTFT (time before the first token: admission wait and prefill)
# or the decode time ((tokens - 1) x TPOT) carries at least 60 % of that rise.  A clear majority,
# so that at most one of the two fires; no published figure.
CARRY_SHARE = 0.6

# What each rule needs from the server, and the servers whose names provide it (analysis/measure/target.py).
NEEDS = {
    "kv_cache_full": (("kv_cache_usage_pct",), "KV-cache usage (vLLM, SGLang, older llama.cpp)"),
    "preemption": (("preempted_s",), "preemption counter (vLLM, SGLang)"),
    "queue_growing": (("llm_running", "llm_waiting"), "engine running and waiting sequences "
                                                      "(vLLM, SGLang, TGI, llama.cpp)"),
}


def _series(ctx: Context, host: str, key: str, steps: list[SummaryStep]) -> list[tuple[SummaryStep, float]]:
    return [(s, v) for s in steps if (v := ctx.metric(s, host, f"target.{key}")) is not None]


def _hosts_with(ctx: Context, key: str) -> list[str]:
    return [h for h in ctx.server_hosts() if any(ctx.metric(s, h, f"target.{key}") is not None for s in ctx.steps)]


def _cache_limited(ctx: Context, step: SummaryStep, host: str) -> bool:
    """Sequences waited or were preempted at the step (True when the server exports neither)."""
    waiting, preempted = ctx.metric(step, host, "target.llm_waiting"), ctx.metric(step, host, "target.preempted_s")
    if waiting is None and preempted is None:
        return True
    return (waiting or 0.0) > 0 or (preempted or 0.0) > 0


def kv_cache_full(ctx: Context) -> list[Finding]:
    out = []
    for host in _hosts_with(ctx, "kv_cache_usage_pct"):
        full = [(s, v) for s, v in _series(ctx, host, "kv_cache_usage_pct", ctx.late())
                if v >= KV_FULL_PCT and _cache_limited(ctx, s, host)]
        if not full:
            continue
        first = full[0][0]
        out.append(finding("kv_cache_full", [s for s, _ in full],
                           {"host": host, "kv_cache_usage_pct": {str(s["users"]): round(v, 2) for s, v in full},
                            "threshold_pct": KV_FULL_PCT},
                           f"{host}: the KV cache was {max(v for _, v in full):.0f} % full from "
                           f"{users_text(first['users'])} on: new sequences wait for cache blocks, running "
                           "ones are preempted.",
                           "Give the cache more memory (vLLM --gpu-memory-utilization, a smaller --max-model-len, "
                           "FP8 KV cache --kv-cache-dtype fp8), or admit fewer sequences (--max-num-seqs); "
                           "beyond that, more replicas."))
    return out


def preemption(ctx: Context) -> list[Finding]:
    out = []
    before = ctx.before_knee()
    for host in _hosts_with(ctx, "preempted_s"):
        base = ctx.metric(before, host, "target.preempted_s") if before is not None else None
        base = base or 0.0
        rising = [(s, v) for s, v in _series(ctx, host, "preempted_s", ctx.late())
                  if v > PREEMPTION_MIN_S and v > base]
        if not rising:
            continue
        worst = max(rising, key=lambda sv: sv[1])
        out.append(finding("preemption", [s for s, _ in rising],
                           {"host": host, "preempted_s": {str(s["users"]): round(v, 3) for s, v in rising},
                            "before_knee_s": base},
                           f"{host}: the engine preempted {worst[1]:.1f} sequences/s at {users_text(worst[0]['users'])} "
                           f"({base:.1f}/s before the knee): each one is computed again when it resumes.",
                           "Preemption means the KV cache cannot hold the batch: more cache memory "
                           "(--gpu-memory-utilization), fewer sequences at once (--max-num-seqs, "
                           "--max-num-batched-tokens), or shorter outputs; vLLM's docs, 'Preemption'."))
    return out


def queue_growing(ctx: Context) -> list[Finding]:
    knee, late = ctx.knee_step(), ctx.late()
    if knee is None or len(late) < 2:
        return []
    last = late[-1]
    out = []
    for host in _hosts_with(ctx, "llm_waiting"):
        w0, w1 = ctx.metric(knee, host, "target.llm_waiting"), ctx.metric(last, host, "target.llm_waiting")
        r0, r1 = ctx.metric(knee, host, "target.llm_running"), ctx.metric(last, host, "target.llm_running")
        if w0 is None or w1 is None or r0 is None or r1 is None or r0 <= 0:
            continue
        if w1 - w0 < WAITING_RISE_MIN or r1 > r0 * (1 + RUNNING_FLAT_SHARE):
            continue
        out.append(finding("queue_growing", [knee, last],
                           {"host": host, "waiting": {str(knee["users"]): w0, str(last["users"]): w1},
                            "running": {str(knee["users"]): r0, str(last["users"]): r1},
                            "waiting_rise_min": WAITING_RISE_MIN, "running_flat_share": RUNNING_FLAT_SHARE},
                           f"{host}: waiting sequences rose from {w0:.1f} to {w1:.1f} between {users_text(knee['users'])} "
                           f"and {users_text(last['users'])} while running ones stayed at {r0:.1f}-{r1:.1f}: "
                           "the batch is full.",
                           "Raise the batch limit if the KV cache and latency allow it (vLLM --max-num-seqs, "
                           "TGI --max-batch-size, llama.cpp --parallel), else add replicas."))
    return out


def _latency_split(step: SummaryStep) -> tuple[float, float] | None:
    """(TTFT P50, decode time = (tokens - 1) x TPOT P50) of a step, ms; None when not streamed."""
    ttft, tpot = num(step.get("ttft_p50_ms")), num(step.get("tpot_p50_ms"))
    tokens_s, qps = num(step.get("tokens_s")), num(step.get("qps"))
    if ttft is None or tpot is None or tokens_s is None or not qps:
        return None
    return ttft, max(tokens_s / qps - 1.0, 0.0) * tpot


class CarrierEvidence(TypedDict):
    """The evidence of prefill_bound / decode_bound: the step before the knee and the last one."""

    users: list[int | float | None]
    p50_ms: list[float]
    ttft_p50_ms: list[float]
    decode_ms: list[float]
    ttft_share: float
    carry_share: float
    engine_queue_ms: NotRequired[list[float]]  # prefill_bound, where a host exports its queue time
    engine_queue_host: NotRequired[str]


def _carrier(ctx: Context) -> tuple[str, CarrierEvidence] | None:
    """("prefill_bound" | "decode_bound", evidence) when one part carries the latency rise."""
    before, late = ctx.before_knee(), ctx.late()
    if before is None or not late or late[-1] is before:
        return None
    last = late[-1]
    a, b = _latency_split(before), _latency_split(last)
    p0, p1 = num(before.get("p50_ms")), num(last.get("p50_ms"))
    if a is None or b is None or p0 is None or p1 is None or p0 <= 0 or p1 < LATENCY_RISE * p0:
        return None
    d_ttft, d_decode = b[0] - a[0], b[1] - a[1]
    rise = d_ttft + d_decode
    if rise <= 0:
        return None
    ev: CarrierEvidence = {"users": [before.get("users"), last.get("users")], "p50_ms": [p0, p1], "ttft_p50_ms": [a[0], b[0]],
          "decode_ms": [a[1], b[1]], "ttft_share": d_ttft / rise, "carry_share": CARRY_SHARE}
    if d_ttft / rise >= CARRY_SHARE:
        return "prefill_bound", ev
    if d_decode / rise >= CARRY_SHARE:
        return "decode_bound", ev
    return None


def _engine_queue(ctx: Context, steps: list[SummaryStep]) -> tuple[str, list[float]] | None:
    """(host, the server's mean wait to be scheduled at each step, ms) where a host exports it."""
    for host in _hosts_with(ctx, "llm_queue_ms"):
        values = ctx.metric_at_each(steps, host, "target.llm_queue_ms")
        if values is not None:
            return host, values
    return None


def _carried_by(ctx: Context, part: str) -> tuple[CarrierEvidence, list[SummaryStep]] | None:
    """(evidence, the two valid steps it compares) when ``part`` ("prefill_bound" | "decode_bound")
    carries the latency rise (:func:`_carrier`), else None."""
    got = _carrier(ctx)
    if got is None or got[0] != part:
        return None
    ev = got[1]
    users = tuple(num(u) for u in ev["users"])
    return ev, [s for s in ctx.valid if num(s.get("users")) in users]


def _rise(ev: CarrierEvidence) -> str:
    """The opening both carriers' findings share: "From N to M users P50 latency rose a -> b ms"."""
    (u0, u1), (p0, p1) = ev["users"], ev["p50_ms"]
    return f"From {users_text(u0)} to {users_text(u1)} P50 latency rose {p0:.0f} -> {p1:.0f} ms"


def prefill_bound(ctx: Context) -> list[Finding]:
    carried = _carried_by(ctx, "prefill_bound")
    if carried is None:
        return []
    ev, steps = carried
    why = "requests wait to be admitted or prefilled, not to decode"
    queue = _engine_queue(ctx, steps) if len(steps) == 2 else None
    if queue is not None:
        host, (q0, q1) = queue
        ev = {**ev, "engine_queue_ms": [q0, q1], "engine_queue_host": host}
        why = (f"{host}'s own queue time went {q0:.0f} -> {q1:.0f} ms, so "
               + ("most of it is waiting to be scheduled" if q1 - q0 >= 0.5 * (ev["ttft_p50_ms"][1] - ev["ttft_p50_ms"][0])
                  else "most of it is prefill, not waiting to be scheduled"))
    return [finding("prefill_bound", steps, ev,
                    f"{_rise(ev)} and the time to the first token carried {ev['ttft_share']:.0%} of the "
                    f"rise (TTFT P50 {ev['ttft_p50_ms'][0]:.0f} -> {ev['ttft_p50_ms'][1]:.0f} ms): {why}.",
                    "Read queue_growing / kv_cache_full for why admission waits; for long prompts enable "
                    "chunked prefill (vLLM --enable-chunked-prefill, --max-num-batched-tokens) and prefix "
                    "caching, or split prefill from decode (disaggregated serving).")]


def decode_bound(ctx: Context) -> list[Finding]:
    carried = _carried_by(ctx, "decode_bound")
    if carried is None:
        return []
    ev, steps = carried
    return [finding("decode_bound", steps, ev,
                    f"{_rise(ev)} and decoding ((tokens - 1) x TPOT) carried {1 - ev['ttft_share']:.0%} of "
                    f"the rise ({ev['decode_ms'][0]:.0f} -> {ev['decode_ms'][1]:.0f} ms): each decode step slows "
                    "as the batch grows.",
                    "Decoding is memory-bandwidth bound: a quantized model or KV cache (FP8), speculative "
                    "decoding, tensor parallelism, or a cap on sequences per replica (--max-num-seqs) "
                    "where TPOT matters more than throughput.")]


def unchecked(ctx: Context) -> list[str]:
    """For a streaming run: one line per engine rule that a host's /metrics could not feed."""
    if not any(num(s.get("ttft_p50_ms")) is not None for s in ctx.steps):
        return []
    hosts = [h for h in ctx.server_hosts()
             if any(as_dict(as_dict(as_dict(s.get("server")).get(h)).get("target")) for s in ctx.steps)]
    if not hosts:
        return ["kv_cache_full, preemption, queue_growing: not checked, no server /metrics was scraped "
                "(set metrics_url)"] + prefix_unchecked(ctx)
    out = []
    for host in hosts:
        for rule, (keys, what) in NEEDS.items():
            if not all(host in _hosts_with(ctx, k) for k in keys):
                out.append(f"{rule}: not checked on {host}, its /metrics has no {what}")
    return out + prefix_unchecked(ctx)


# prefix_cache_cold: the workload shares prefixes worth at least PREFIX_EXPECT_MIN_PCT of its prompt
# tokens (analysis/measure/llmworkload.py: share x the cacheable fraction, measured on the rows) and the
# server's prefix-cache hit rate, mean over the valid steps, is below COLD_SHARE of that.  Half: a
# block cache reads a block or so below the expectation and misses each prefix's first use (on the
# demo target, 8 prefixes of 64 tokens behind 16-token messages at share 0.9: 77.5 % measured for
# 78.2 % expected, tests/test_llm_prefixes.py);
# a cache that is off or thrashes reads near 0.  No published figure.
PREFIX_EXPECT_MIN_PCT = 10.0
COLD_SHARE = 0.5
PREFIX_NEEDS = "prefix-cache hit and query counters (vLLM, SGLang, llama.cpp)"


def _expected_hit(ctx: Context) -> Mapping[str, object] | None:
    """The workload's [request.prefix] facts (or a trace's) when it shares enough tokens to expect hits."""
    for key in ("prefix", "trace"):
        p: Mapping[str, object] = as_dict(ctx.llm_workload.get(key))
        expected = num(p.get("expected_hit_pct"))
        if expected is not None and expected >= PREFIX_EXPECT_MIN_PCT:
            return p
    return None


def _hit_hosts(ctx: Context) -> list[str]:
    return [h for h in ctx.server_hosts()
            if any(ctx.metric(s, h, f"target.{k}") is not None for s in ctx.steps
                   for k in ("prefix_hit_pct", "prefix_hit_own_pct"))]


def prefix_cache_cold(ctx: Context) -> list[Finding]:
    p = _expected_hit(ctx)
    if p is None:
        return []
    expected = num(p.get("expected_hit_pct")) or 0.0  # _expected_hit: a number
    out = []
    for host in _hit_hosts(ctx):
        key = "prefix_hit_pct" if host in _hosts_with(ctx, "prefix_hit_pct") else "prefix_hit_own_pct"
        series = _series(ctx, host, key, ctx.valid)
        if not series:
            continue
        mean = sum(v for _, v in series) / len(series)
        if mean >= COLD_SHARE * expected:
            continue
        out.append(finding("prefix_cache_cold", [s for s, _ in series],
                           {"host": host, "hit_pct": {str(s.get("users")): round(v, 2) for s, v in series},
                            "hit_pct_mean": round(mean, 2), "expected_hit_pct": expected,
                            "share": p.get("share"), "prefix_tokens": p.get("tokens"), "prefixes": p.get("count"),
                            "cold_share": COLD_SHARE},
                           f"{host}: the prefix cache served {mean:.0f} % of prompt tokens although "
                           f"{expected:.0f} % were shared {_sharing(p)}: shared prompts are computed again.",
                           "Turn prefix caching on (vLLM --enable-prefix-caching, on by default in V1; SGLang's radix "
                           "cache unless --disable-radix-cache), give the cache room to keep the prefixes (more KV "
                           "memory), and route requests that share a prefix to the same replica."))
    return out


def _sharing(p: Mapping[str, object]) -> str:
    if "share" in p:
        return (f"prefixes ({p.get('count')} prefixes of {p.get('tokens')} tokens in "
                f"{num(p.get('share')) or 0.0:.0%} of requests)")
    return f"blocks (the trace's hash ids, {p.get('block_tokens')}-token blocks, over one pass)"


def prefix_unchecked(ctx: Context) -> list[str]:
    """The line for prefix_cache_cold where the workload shares prefixes but no host says its hit rate."""
    if _expected_hit(ctx) is None or _hit_hosts(ctx):
        return []
    return [f"prefix_cache_cold: not checked, no server /metrics has {PREFIX_NEEDS}"]

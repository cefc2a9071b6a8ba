"""Memory and GPU rules: a model copied per thread (RSS or GPU memory linear in users), a GPU
serialised on one stream (utilisation low and flat while QPS is flat), and GPU memory creeping
(the peak rising step after step while the work held)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from kneeswarm.analysis.findings.context import Context, process_evidence, process_growth, process_text
from kneeswarm.analysis.schema.summary import Finding, SummaryStep, num
from kneeswarm.analysis.findings.finding import finding

logger = logging.getLogger(__name__)

# model_copies looks at every valid step (not only after the knee): the growth is the signal.
MODEL_COPY_R2 = 0.90  # "about linearly": a straight line explains >= 90 % of the variation
MODEL_COPY_MIN_GROWTH_MB = 100.0  # the fitted growth over the tested users, at least this ...
MODEL_COPY_MIN_GROWTH_RATIO = 0.5  # ... and at least half the memory at the first step
MODEL_COPY_MIN_STEPS = 3
# ... and a copy's worth per added user: memory that grows with the users but by less than any model
# worth serving is something else -- an LLM engine's KV cache and prompt cache filling as more
# sequences run (llama.cpp's llama-server: +20 MB per user, 76 -> 181 MB from 1 to 6 users, with a
# 10.7 MB model, tests_conformance/test_llamacpp.py), per-connection buffers, allocator arenas.  The
# smallest models commonly served weigh more than this: ResNet-50 98 MB, DistilBERT 268 MB (their
# published weight files; torchvision's and Hugging Face's model cards); a copy per user of a
# model under 50 MB is not reported (it costs little memory either).
MODEL_COPY_MIN_MB_PER_USER = 50.0
# process RSS: the service's, summed over its processes (each one's own counts the pages it shares
# with the others again: pre-forked workers' copy-on-write model weights); the finding names the
# process whose own RSS rose most (Context.process_growth)
MEMORY_METRICS = (("rss_mb", "process RSS"), ("fb_used_mb", "GPU memory"))
GPU_LOW_PCT = 50.0  # specified, no published figure: GPU utilisation < 50 %
GPU_FLAT_POINTS = 10.0  # "flat": utilisation varies by at most 10 points over the late steps
QPS_FLAT = 0.10  # "QPS flat": the late steps' QPS within 10 % of their mean (max - min)
MIN_LATE_STEPS_FOR_FLAT = 2
# gpu_memory_creep: the digest, "GPU memory fragmentation after repeated load/unload: watch the
# peak over long concurrent runs".  Read over the steps at or after the knee while their QPS held
# (QPS_FLAT): the work per second did not grow, so memory had no reason to.  No published figures:
GPU_CREEP_MIN_STEPS = 3  # a rise at each of at least two step changes, not one allocation
GPU_CREEP_MIN_MB = 256.0  # the peak rose at least this much in all (a cache block or two is noise) ...
GPU_CREEP_MIN_SHARE = 0.05  # ... and at least 5 % of the first step's peak


def _linear(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(slope, R²) of the least-squares line."""
    slope, intercept = np.polyfit(x, y, 1)
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum((y - (slope * x + intercept)) ** 2)) / ss_tot if ss_tot > 0 else 0.0
    return float(slope), r2


def _model_copy(ctx: Context, h: str, key: str, label: str) -> Finding | None:
    pts = [(num(s["users"]), v, s) for s in ctx.valid if (v := ctx.metric(s, h, key)) is not None]
    if len(pts) < MODEL_COPY_MIN_STEPS:
        return None
    x, y = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
    if np.ptp(x) <= 0:
        return None
    slope, r2 = _linear(x, y)
    growth = slope * float(np.ptp(x))
    if slope < MODEL_COPY_MIN_MB_PER_USER or r2 < MODEL_COPY_R2 or growth < MODEL_COPY_MIN_GROWTH_MB \
            or growth < MODEL_COPY_MIN_GROWTH_RATIO * y[0]:
        return None
    grew = process_growth([p[2] for p in pts], h, key, ctx.hosts) if key == "rss_mb" else None
    return finding("model_copies", [p[2] for p in pts],
                   {"host": h, "metric": key, "mb_per_user": slope, "r2": r2, "first_mb": float(y[0]),
                    "last_mb": float(y[-1]), "from_users": pts[0][2]["users"], "to_users": pts[-1][2]["users"],
                    **process_evidence(grew)},
                   f"{h}: {label} grew about linearly with users, {slope:,.1f} MB per user (R² {r2:.2f}, "
                   f"{y[0]:,.0f} -> {y[-1]:,.0f} MB{process_text(grew, ' MB')}): the model is probably copied per "
                   "thread or request.",
                   "Load the model once and share it: ONNX Runtime sessions are thread-safe (one "
                   "InferenceSession for all threads); on a GPU, one model instance per device.")


def model_copies(ctx: Context) -> list[Finding]:
    out = []
    for h in ctx.server_hosts():
        for key, label in MEMORY_METRICS:
            if (f := _model_copy(ctx, h, key, label)) is not None:
                out.append(f)
    return out


def gpu_serialized(ctx: Context) -> list[Finding]:
    late = ctx.late()
    if ctx.knee_users is None or len(late) < MIN_LATE_STEPS_FOR_FLAT:
        return []
    qps = np.array([num(s["qps"]) for s in late])
    if qps.mean() <= 0 or np.ptp(qps) > QPS_FLAT * qps.mean():
        return []
    out = []
    for h in ctx.server_hosts():
        sm = ctx.metric_at_each(late, h, "sm_pct")
        if sm is None or max(sm) >= GPU_LOW_PCT or max(sm) - min(sm) > GPU_FLAT_POINTS:
            continue
        out.append(finding("gpu_serialized", late,
                           {"host": h, "sm_pct_max": max(sm), "sm_pct_min": min(sm), "qps_min": float(qps.min()),
                            "qps_max": float(qps.max()), "from_users": late[0]["users"], "to_users": late[-1]["users"]},
                           f"{h}: GPU utilisation stayed at {min(sm):.0f}-{max(sm):.0f}% while QPS stayed flat "
                           f"({qps.min():,.1f}-{qps.max():,.1f}/s) from {late[0]['users']} to {late[-1]['users']} "
                           "users: the GPU is waiting, not working.",
                           "Look for one CUDA stream shared by all threads, a torch.cuda.synchronize() per request, "
                           "or no batching: one stream per thread (the article: 91% utilisation) or dynamic "
                           "batching (Triton, vLLM)."))
    return out


def _work_held(late: list[SummaryStep]) -> bool:
    qps = np.array([num(s["qps"]) for s in late])
    return len(late) >= GPU_CREEP_MIN_STEPS and qps.mean() > 0 and np.ptp(qps) <= QPS_FLAT * qps.mean()


def gpu_memory_creep(ctx: Context) -> list[Finding]:
    late = ctx.late()
    if ctx.knee_users is None or not _work_held(late):
        return []
    out = []
    for h in ctx.server_hosts():
        peaks = ctx.metric_at_each(late, h, "fb_peak_mb")
        if peaks is None or _model_copy(ctx, h, "fb_used_mb", "GPU memory") is not None:
            continue  # memory that grows with the users is model_copies, not creep
        rise = peaks[-1] - peaks[0]
        rising = all(b > a for a, b in zip(peaks, peaks[1:]))
        if not rising or rise < GPU_CREEP_MIN_MB or rise < GPU_CREEP_MIN_SHARE * peaks[0]:
            continue
        out.append(finding("gpu_memory_creep", late,
                           {"host": h, "from_users": late[0]["users"], "to_users": late[-1]["users"],
                            "peak_mb_from": peaks[0], "peak_mb_to": peaks[-1], "rise_mb": rise,
                            "threshold_mb": GPU_CREEP_MIN_MB},
                           f"{h}: peak GPU memory rose at every step, {peaks[0]:,.0f} -> {peaks[-1]:,.0f} MB "
                           f"(+{rise:,.0f} MB), from {late[0]['users']} to {late[-1]['users']} users while QPS held: "
                           "memory is fragmenting or being kept per request or thread.",
                           "Run longer at a fixed load and watch the peak: cap the allocator's cache "
                           "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, max_split_size_mb), load models "
                           "once instead of per request, and keep one model instance per device."))
    return out

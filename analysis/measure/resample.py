"""A step's figures resampled from its own window: how far each could have come out otherwise.

A verdict is only as good as its repeat, and the first repeat a run has is inside itself: each
step's steady window is cut into ``BLOCK_S``-second blocks, and a resample draws as many blocks
with replacement (a moving-block bootstrap: rows and samples close in time stay together, so
bursts and the 2-s thread samples are kept whole).  One draw of blocks per step and resample
(``block_picks``, seeded by the step's position) serves the client's figures and every host's
samples alike, so what moves together in time (QPS and the CPU that served it) moves together
in the resamples too.  kneeswarm.analysis.summary.confidence reruns the knee and every finding
rule on the resampled steps.

What is resampled, and how:

* **latency** (mean, P50, P95, P99): the step's successful rows.  Above ``MAX_ROWS`` rows, a
  uniform subsample of that many is kept (memory stays bounded on any run) and each resampled
  deviation from the subsample's own figure is scaled by √(m/n), the m-out-of-n bootstrap
  (Bickel, Götze & van Zwet 1997), as kneeswarm.analysis.measure.bootstrap does for compare.
  Every deviation is also scaled by √(k/(k−1)) for k blocks (``spread_correction``).
  A resampled figure is the step's own plus that deviation, so the point estimate stays the
  summary's exactly.
* **QPS, closed loop**: N users without think time start their requests in cohorts, so counts per
  block are quantised and their spread says little (the master's step judge found the same:
  locustfiles/steady.py).  Little's law gives the QPS from the latency instead: X = N / (R + Z),
  so a resample's X* = X · (R + Z) / (R* + Z), times (1 + u), u uniform in ±N/(rows − N): the
  count's two ends, each user's requests straddling either end by under one row.
* **QPS, open loop**: arrivals are drawn independently, so the blocks' counts are resampled.
* **server samples**: the means of each block (kneeswarm.analysis.measure.serverstats over the
  blocks as windows), averaged over the drawn blocks; the deviation from the blocks' own mean is
  added to the step's figure.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, TypeGuard

import numpy as np
import pandas as pd

from kneeswarm.analysis.measure.serverstats import server_metrics
from kneeswarm.analysis.schema.summary import ServerMetrics

logger = logging.getLogger(__name__)

RESAMPLES = 200  # resamples per run: a support of 0.95 is then known to about ±0.015
BLOCK_S = 2.0  # block length: the thread sampler's period (collectors/procfs.py THREAD_INTERVAL)
# A window shorter than this many blocks of BLOCK_S is cut into this many shorter ones: a bootstrap of
# few blocks has few possible draws and understates the spread (two blocks: three outcomes; seen on
# a repeated run of 2-s windows whose knee moved 4 -> 6 between runs while each run's interval held
# only its own knee).
MIN_BLOCKS = 5
MAX_ROWS = 5000  # successful rows per step kept for the latency quantiles (m-out-of-n above it)
SEED = 11
BLOCKS_KEY = "block_sample"  # a step's BlockSample in the step statistics (never written to the summary)
QUANTILES = {"p50_ms": 50.0, "p95_ms": 95.0, "p99_ms": 99.0}


def n_blocks(window_s: float) -> int:
    """How many blocks a window of ``window_s`` seconds is cut into (0: no usable window)."""
    if not (math.isfinite(window_s) and window_s > 0):
        return 0
    return max(MIN_BLOCKS, int(window_s // BLOCK_S))


def block_edges(t_lo: float, t_hi: float) -> np.ndarray:
    """The ``n_blocks + 1`` edges of a window's equal blocks (empty when the window is not usable)."""
    k = n_blocks(t_hi - t_lo)
    return np.linspace(t_lo, t_hi, k + 1) if k else np.empty(0)


def spread_correction(k: int) -> float:
    """√(k/(k−1)): a bootstrap over k blocks gives a mean's variance (k−1)/k of the unbiased estimate
    (the plug-in variance); resampled deviations are scaled back by this."""
    return math.sqrt(k / (k - 1)) if k > 1 else 1.0


def block_picks(k: int, position: int, resamples: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """(resamples, k): how often each of a step's k blocks was drawn in each resample; the same
    for a step's client rows and its hosts' samples (seeded by the step's position)."""
    rng = np.random.default_rng([seed, position])
    drawn = rng.integers(0, k, size=(resamples, k))
    out = np.zeros((resamples, k), dtype=np.int64)
    np.add.at(out, (np.repeat(np.arange(resamples), k), drawn.ravel()), 1)
    return out


@dataclass
class BlockSample:
    """What a step keeps of its rows for resampling: successful rows per block, and a (sub)sample
    of their latencies, sorted, each with its block."""

    t_lo: float
    t_hi: float
    counts: np.ndarray  # successful rows per block
    latencies: np.ndarray  # sorted
    blocks: np.ndarray  # the block of each latency
    n_ok: int  # successful rows in all (the sample holds min(n_ok, MAX_ROWS))

    @classmethod
    def of(cls, t: np.ndarray, lat: np.ndarray, t_lo: float, t_hi: float, seed: int) -> BlockSample | None:
        """From a step's successful rows (start time, latency); None without a usable window."""
        edges = block_edges(t_lo, t_hi)
        if not len(edges):
            return None
        k = len(edges) - 1
        keep = np.isfinite(lat) & (t >= t_lo) & (t < t_hi)
        t, lat = t[keep], lat[keep]
        block = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, k - 1)
        counts = np.bincount(block, minlength=k)
        n_ok = len(lat)
        if n_ok > MAX_ROWS:
            chosen = np.random.default_rng([SEED, seed, 1]).choice(n_ok, MAX_ROWS, replace=False)
            lat, block = lat[chosen], block[chosen]
        order = np.argsort(lat, kind="stable")
        return cls(t_lo, t_hi, counts, lat[order], block[order], n_ok)

    @property
    def k(self) -> int:
        return len(self.counts)


def _weighted_quantiles(latencies: np.ndarray, weights: np.ndarray, q: float) -> np.ndarray:
    """Per row of ``weights`` (resamples x rows, over ``latencies`` sorted): the q-th percentile
    of the weighted sample (the smallest latency whose cumulative weight reaches q %)."""
    cum = np.cumsum(weights, axis=1)
    total = cum[:, -1:]
    idx = np.argmax(cum >= np.maximum(total * q / 100.0, 1e-12), axis=1)
    return latencies[idx]


def _weighted_linear_quantiles(latencies: np.ndarray, weights: np.ndarray, q: float) -> np.ndarray:
    """Per row of integer ``weights`` (resamples x rows, over ``latencies`` sorted): numpy's default
    (linear) q-th percentile of the sample each row draws, every latency repeated its weight's
    times: the order statistics at (N − 1)·q/100 and the next, interpolated."""
    cum = np.cumsum(weights, axis=1)
    total = cum[:, -1]
    h = np.maximum(total - 1, 0) * q / 100.0
    lo = np.floor(h)
    at = lambda j: (cum <= j[:, None]).sum(axis=1).clip(0, len(latencies) - 1)  # noqa: E731  # the j-th drawn row
    a, b = latencies[at(lo)], latencies[at(np.minimum(lo + 1, np.maximum(total - 1, 0)))]
    return a + (h - lo) * (b - a)


def client_replicates(sample: BlockSample, point: dict[str, Any],  # point: a row of the stats frame
                       picks: np.ndarray, users: float | None,
                      think_ms: float, closed_loop: bool, linear: bool = False) -> dict[str, np.ndarray]:
    """The step's resampled qps, mean_ms and percentiles (arrays of len(picks)); a figure the step
    does not have (NaN, or too few rows) is left out.  ``linear``: a percentile's deviation taken
    between numpy's linear percentiles of the drawn rows and of all rows, the definition of the
    point figure itself (a class's step: kneeswarm.analysis.summary.classes).  Without it, between
    the inverted-CDF ones (the whole's steps, as summaries have been written): on a step of under a
    hundred rows the P99's linear point lies near the second-largest row while the inverted-CDF
    one is the largest, and a draw without that row moves the figure by their whole gap (measured on
    a class step of 96 rows: a point of 56 ms resampled down to −76 ms)."""
    out: dict[str, np.ndarray] = {}
    lat = sample.latencies
    if len(lat) < 2 or picks.shape[1] != sample.k:
        return out
    weights = picks[:, sample.blocks].astype(float)  # each sampled row counts as often as its block was drawn
    keep = weights.sum(axis=1) > 0
    scale = math.sqrt(len(lat) / max(sample.n_ok, len(lat))) * spread_correction(sample.k)
    ones = np.ones((1, len(lat)))
    mean_dev = np.where(keep, (weights @ lat) / np.maximum(weights.sum(axis=1), 1e-12) - lat.mean(), 0.0)
    if _finite(point.get("mean_ms")):
        out["mean_ms"] = float(point["mean_ms"]) + scale * mean_dev
    for key, q in QUANTILES.items():
        if _finite(point.get(key)):
            of = _weighted_linear_quantiles if linear else _weighted_quantiles
            dev = of(lat, weights, q) - of(lat, ones, q)[0]
            out[key] = float(point[key]) + scale * np.where(keep, dev, 0.0)
    qps = point.get("qps")
    if not isinstance(qps, (int, float)) or not _finite(qps):
        return out
    if closed_loop and users and "mean_ms" in out and sample.n_ok > users:
        end = users / (sample.n_ok - users)
        u = np.random.default_rng([SEED, sample.k, sample.n_ok]).uniform(-end, end, len(picks))
        cycle = (float(point.get("mean_ms") or 0.0) + think_ms) / np.maximum(out["mean_ms"] + think_ms, 1e-9)
        out["qps"] = float(qps) * cycle * (1.0 + u)
    else:
        window = sample.t_hi - sample.t_lo
        out["qps"] = float(qps) + spread_correction(sample.k) * (picks @ sample.counts - sample.counts.sum()) / window
    return out


def _finite(v: object) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def flat(metrics: ServerMetrics) -> dict[str, float]:
    """A host's metrics of one window with the target's nested ones as "target.<key>"."""
    out = {k: float(v) for k, v in metrics.items() if _finite(v)}
    target = metrics.get("target")
    if isinstance(target, dict):
        out |= {f"target.{k}": float(v) for k, v in target.items() if _finite(v)}
    return out


def server_deviations(blocks: list[dict[str, ServerMetrics]], picks: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
    """{host: {key: resampled mean − the blocks' own mean}} from a step's per-block server metrics
    (one dict {host: metrics} per block: kneeswarm.analysis.measure.serverstats.server_metrics over the
    blocks as windows).  A deviation, added to the step's own figure, keeps the point estimate the
    summary's exactly; a key is resampled where at least one drawn block measured it (else NaN)."""
    out: dict[str, dict[str, np.ndarray]] = {}
    if not blocks or picks.shape[1] != len(blocks):
        return out
    for host in sorted({h for b in blocks for h in b}):
        per_block = [flat(b.get(host) or {}) for b in blocks]
        keys = sorted({k for m in per_block for k in m})
        values = np.array([[m.get(k, np.nan) for k in keys] for m in per_block], dtype=float)  # blocks x keys
        have = np.isfinite(values).astype(float)
        filled = np.where(have > 0, values, 0.0)
        w = picks.astype(float)
        with np.errstate(invalid="ignore", divide="ignore"):
            means = (w @ filled) / (w @ have)
            base = filled.sum(axis=0) / have.sum(axis=0)
        c = spread_correction(len(blocks))
        out[host] = {k: c * (means[:, j] - base[j]) for j, k in enumerate(keys)}
    return out


@dataclass
class Replicates:
    """Every step's resampled figures, in the summary's step order."""

    client: list[dict[str, np.ndarray]]  # per step: {qps, mean_ms, p50_ms, p95_ms, p99_ms}
    server: list[dict[str, dict[str, np.ndarray]]]  # per step: {host: {key: deviation}}
    resamples: int


def step_replicates(stats: Any, hosts: dict[str, dict[str, pd.DataFrame]], think_ms: float, closed_loop: bool,
                    resamples: int = RESAMPLES) -> Replicates:
    """The Replicates of a run's step statistics (kneeswarm.analysis.measure.requestscan: a
    ``block_sample`` per step) and its hosts' parsed samples (one pass of server_metrics over every
    step's blocks at once)."""
    rows = stats.to_dict("records")
    samples: list[BlockSample | None] = [r.get(BLOCKS_KEY) if isinstance(r.get(BLOCKS_KEY), BlockSample) else None
                                         for r in rows]
    picks = [block_picks(s.k, i, resamples) if s is not None else None for i, s in enumerate(samples)]
    edges = [block_edges(s.t_lo, s.t_hi) if s is not None else np.empty(0) for s in samples]
    lo = np.concatenate([e[:-1] for e in edges if len(e)] or [np.empty(0)])
    hi = np.concatenate([e[1:] for e in edges if len(e)] or [np.empty(0)])
    blocks = server_metrics(hosts, lo, hi) if len(lo) else []
    client: list[dict[str, np.ndarray]] = []
    server: list[dict[str, dict[str, np.ndarray]]] = []
    at = 0
    for row, sample, pick in zip(rows, samples, picks):
        if sample is None or pick is None:
            client.append({})
            server.append({})
            continue
        users = row.get("users")
        users = float(users) if _finite(users) and users > 0 else None
        client.append(client_replicates(sample, row, pick, users, think_ms, closed_loop))
        server.append(server_deviations(blocks[at:at + sample.k], pick))
        at += sample.k
    return Replicates(client, server, resamples)

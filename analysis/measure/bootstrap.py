"""Bootstrap confidence intervals for a step's QPS and P99, from the request rows of its steady window.

What is resampled:

* **P99**: the successful rows' ``latency_ms`` (the rows the summary's ``p99_ms`` is computed from,
  ``numpy.percentile`` linear).  A step with more than ``MAX_ROWS_PER_STEP`` such rows is
  bootstrapped from a uniform subsample of that many (bottom-k of a seeded random key, so the parts
  can be read one at a time and memory stays bounded); the resampled deviations are then scaled by
  √(m/n), the m-out-of-n bootstrap (Bickel, Götze & van Zwet 1997): the spread of a sample
  quantile shrinks as 1/√n, so the spread measured on m rows is narrowed to what n rows give.
* **QPS**: resampling single rows cannot change how many there are, so the window is cut into
  equal time bins (``QPS_BIN_S``, at least ``MIN_BINS`` of them) and the bins' counts of
  successful rows are resampled (a block bootstrap over the rows); QPS* = mean count / bin width.

Each replicate gives a deviation θ* − θ̂ of the resampled statistic from the sample's own; the
interval of a difference new − base is the point difference plus the (α/2, 1 − α/2) quantiles of
dev_new − dev_base, the two runs resampled independently (the percentile interval when nothing
was subsampled).  Every random draw comes from ``numpy.random.default_rng`` seeded from
(``seed``, the step's position, which run), so a comparison gives the same answer every time.
"""

from __future__ import annotations

import logging
import math
import zlib
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pyarrow.parquet as pq

from kneeswarm.contracts.rundir import REQUEST_SCHEMA, RunDir

logger = logging.getLogger(__name__)

RESAMPLES = 1000  # bootstrap replicates per statistic
CONFIDENCE = 0.95
SEED = 7
MAX_ROWS_PER_STEP = 10_000  # rows per step resampled for the P99; above it a uniform subsample
CHUNK = 100  # replicates drawn at once (memory: CHUNK x MAX_ROWS_PER_STEP indices)
QPS_BIN_S = 0.5  # width of the time bins resampled for the QPS ...
MIN_BINS = 40  # ... narrower on a short window, so that there are at least this many
MIN_ROWS_P99 = 20  # fewer successful rows than this: no interval for the P99
# A class of a traffic mix is judged on its own rows, often a few hundred a step: there the bootstrap
# of a P99 (its top 1 % of rows, a handful) came out too narrow, and 2 of 8 comparisons of one
# configuration with itself called a class's P99 worse (tests/test_mix_compare.py).  Its P99 gets
# an interval only with at least this many rows in the step: 20 above its P99 (history's drift test
# asks 10 beyond a percentile, kneeswarm.analysis.runs.history.MIN_TAIL_ROWS, for a point figure).
MIN_ROWS_CLASS_P99 = 2_000
P99 = 99.0
COLUMNS = ["t_start", "latency_ms", "ok"]


@dataclass
class StepSample:
    """What the bootstrap needs from one step's steady window [t_lo, t_hi)."""

    users: Any
    t_lo: float
    t_hi: float
    n_bins: int
    counts: np.ndarray = field(init=False)  # successful rows per time bin
    n_latencies: int = 0  # successful rows with a finite latency (all of them, not only the sample)
    keys: np.ndarray = field(default_factory=lambda: np.empty(0))
    latencies: np.ndarray = field(default_factory=lambda: np.empty(0))  # the (sub)sample

    def __post_init__(self) -> None:
        self.counts = np.zeros(self.n_bins, dtype=np.int64)

    @property
    def bin_width(self) -> float:
        return (self.t_hi - self.t_lo) / self.n_bins

    def qps(self) -> float:
        return float(self.counts.sum()) / (self.t_hi - self.t_lo)

    def p99(self) -> float | None:
        return float(np.percentile(self.latencies, P99)) if self.latencies.size else None


def n_bins(window_s: float) -> int:
    return max(MIN_BINS, int(math.ceil(window_s / QPS_BIN_S - 1e-9)))


def _add(sample: StepSample, t: np.ndarray, lat: np.ndarray, rng: np.random.Generator, max_rows: int) -> None:
    """Add one part's successful rows that fall in the window; keep the max_rows smallest keys."""
    inside = (t >= sample.t_lo) & (t < sample.t_hi)
    if not inside.any():
        return
    ti, li = t[inside], lat[inside]
    idx = np.minimum(((ti - sample.t_lo) / sample.bin_width).astype(np.int64), sample.n_bins - 1)
    sample.counts += np.bincount(idx, minlength=sample.n_bins)
    li = li[np.isfinite(li)]
    sample.n_latencies += li.size
    keys = np.concatenate([sample.keys, rng.random(li.size)])
    lats = np.concatenate([sample.latencies, li])
    if keys.size > max_rows:
        keep = np.argpartition(keys, max_rows - 1)[:max_rows]
        keys, lats = keys[keep], lats[keep]
    sample.keys, sample.latencies = keys, lats


def _read_part(part: Any, by_class: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(t_start, latency_ms, class or None) of a part's successful rows (a null ``ok`` is a failure);
    ``by_class``: each row's class too (None for a part of a run without the column)."""
    table = pq.read_table(part, columns=COLUMNS + ["class"], schema=REQUEST_SCHEMA) if by_class else \
        pq.read_table(part, columns=COLUMNS)
    ok = np.asarray(table.column("ok").fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)
    t = np.asarray(table.column("t_start").to_numpy(zero_copy_only=False), dtype=float)
    lat = np.asarray(table.column("latency_ms").to_numpy(zero_copy_only=False), dtype=float)
    cls = np.asarray(table.column("class").to_numpy(zero_copy_only=False), dtype=object)[ok] if by_class else None
    return t[ok], lat[ok], cls


def _new_samples(windows: Sequence[tuple[Any, float | None, float | None]]) -> list[StepSample | None]:
    """One empty StepSample per (users, t_lo, t_hi) window (None for a window that is not finite and positive)."""
    samples: list[StepSample | None] = []
    for users, lo, hi in windows:
        if lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi) and hi > lo:
            samples.append(StepSample(users, float(lo), float(hi), n_bins(hi - lo)))
        else:
            samples.append(None)
    return samples


def step_samples(run: RunDir, windows: Sequence[tuple[Any, float | None, float | None]], seed: int = SEED,
                 max_rows: int = MAX_ROWS_PER_STEP) -> tuple[list[StepSample | None], list[str]]:
    """One StepSample per (users, t_lo, t_hi) window (None for a window that is not finite and
    positive), reading the request parts one at a time; and one warning line per unreadable part."""
    samples, _, warnings = step_and_class_samples(run, windows, seed, max_rows, classes=False)
    return samples, warnings


def step_and_class_samples(run: RunDir, windows: Sequence[tuple[Any, float | None, float | None]], seed: int = SEED,
                           max_rows: int = MAX_ROWS_PER_STEP, classes: bool = True,
                           ) -> tuple[list[StepSample | None], dict[str, list[StepSample | None]], list[str]]:
    """``step_samples``, and with ``classes`` one list of StepSamples per class of a traffic mix
    (the class's rows in the same windows, subsampled with its own seeded draws), from one read
    of the parts."""
    samples = _new_samples(windows)
    rngs = [np.random.default_rng([seed, i, 0]) for i in range(len(samples))]
    per_class: dict[str, tuple[list[StepSample | None], list[np.random.Generator]]] = {}
    warnings: list[str] = []
    for part in run.request_parts():
        try:
            t, lat, cls = _read_part(part, classes)
        except Exception as exc:  # noqa: BLE001 — a torn part from a crash must not stop the comparison
            warnings.append(f"{part}: unreadable, left out of the comparison ({type(exc).__name__}: {exc})")
            continue
        for sample, rng in zip(samples, rngs):
            if sample is not None:
                _add(sample, t, lat, rng, max_rows)
        for name in ([] if cls is None else sorted({str(c) for c in cls if c is not None})):
            if name not in per_class:  # seeded by the class's name: the same draws in every comparison
                key = zlib.crc32(name.encode())
                per_class[name] = (_new_samples(windows), [np.random.default_rng([seed, i, 1, key]) for i in range(len(windows))])
            mine = cls == name
            for sample, rng in zip(*per_class[name]):
                if sample is not None:
                    _add(sample, t[mine], lat[mine], rng, max_rows)
    return samples, {name: got for name, (got, _) in per_class.items()}, warnings


def qps_deviations(sample: StepSample, rng: np.random.Generator, resamples: int = RESAMPLES) -> np.ndarray | None:
    """QPS* − QPS over ``resamples`` resamplings of the time bins (None with fewer than 2 bins)."""
    if sample.n_bins < 2:
        return None
    idx = rng.integers(0, sample.n_bins, size=(resamples, sample.n_bins))
    return sample.counts[idx].mean(axis=1) / sample.bin_width - sample.counts.mean() / sample.bin_width


def p99_deviations(sample: StepSample, rng: np.random.Generator, resamples: int = RESAMPLES,
                   min_rows: int = 0) -> np.ndarray | None:
    """P99* − P99 of the (sub)sample, scaled by √(m/n) (None with fewer than MIN_ROWS_P99 rows, or than
    ``min_rows``)."""
    lat = sample.latencies
    m = lat.size
    if m < max(MIN_ROWS_P99, min_rows):
        return None
    centre = float(np.percentile(lat, P99))
    out = np.empty(resamples)
    for a in range(0, resamples, CHUNK):
        b = min(a + CHUNK, resamples)
        out[a:b] = np.percentile(lat[rng.integers(0, m, size=(b - a, m))], P99, axis=1)
    return (out - centre) * math.sqrt(m / max(sample.n_latencies, m))


def diff_interval(dev_base: np.ndarray | None, dev_new: np.ndarray | None, point: float | None,
                  confidence: float = CONFIDENCE) -> list[float] | None:
    """[lo, hi] of new − base: ``point`` plus the quantiles of dev_new − dev_base; None without both."""
    if dev_base is None or dev_new is None or point is None:
        return None
    alpha = 1.0 - confidence
    lo, hi = np.quantile(dev_new - dev_base, [alpha / 2, 1 - alpha / 2])
    return [float(point + lo), float(point + hi)]


def diff_p_value(dev_base: np.ndarray | None, dev_new: np.ndarray | None, point: float | None) -> float | None:
    """The two-sided bootstrap p-value of new − base = 0: the smallest α whose (1 − α) percentile
    interval (``diff_interval``'s) reaches 0; None without both."""
    if dev_base is None or dev_new is None or point is None:
        return None
    d = point + (dev_new - dev_base)
    return float(min(1.0, 2.0 * min(np.mean(d <= 0), np.mean(d >= 0))))


def holm(p: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of ``p`` (family-wise error at most α when each adjusted p < α)."""
    order = np.argsort(p, kind="stable")
    m, out, running = len(p), [1.0] * len(p), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(p[i])))
        out[i] = running
    return out


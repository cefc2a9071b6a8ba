"""Each step resampled from its own window (kneeswarm.analysis.measure.resample).

Expected values come from numpy on the same rows: the blocks' counts from np.histogram, a
resample's mean from the drawn blocks' rows concatenated by hand, the bootstrap's spread against
the textbook standard error of iid rows, and the closed loop's QPS against Little's law.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from kneeswarm.analysis.measure.resample import (BLOCK_S, RESAMPLES, BlockSample, block_edges, block_picks,
                                                 client_replicates, n_blocks, server_deviations)

T0 = 1_700_000_000.0


def rows(seconds: float, per_s: float, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = int(seconds * per_s)
    t = np.sort(T0 + rng.uniform(0, seconds, n))
    return t, rng.lognormal(math.log(50), 0.4, n)


def point(lat: np.ndarray, seconds: float) -> dict:
    return {"qps": len(lat) / seconds, "mean_ms": float(lat.mean()),
            **{k: float(np.percentile(lat, q)) for k, q in (("p50_ms", 50), ("p95_ms", 95), ("p99_ms", 99))}}


def test_blocks_and_picks():
    assert n_blocks(30.0) == int(30 // BLOCK_S) and n_blocks(1.0) == 5 and n_blocks(math.nan) == 0
    picks = block_picks(15, 3)
    assert picks.shape == (RESAMPLES, 15) and (picks.sum(axis=1) == 15).all()
    assert (picks == block_picks(15, 3)).all() and not (picks == block_picks(15, 4)).all()  # seeded by position
    t, lat = rows(30, 40)
    s = BlockSample.of(t, lat, T0, T0 + 30, seed=0)
    assert (s.counts == np.histogram(t, bins=block_edges(T0, T0 + 30))[0]).all()
    assert s.n_ok == len(lat) and (np.diff(s.latencies) >= 0).all()


def test_every_block_once_gives_the_point_itself():
    t, lat = rows(30, 40)
    s = BlockSample.of(t, lat, T0, T0 + 30, seed=0)
    ones = np.ones((5, s.k), dtype=np.int64)
    out = client_replicates(s, point(lat, 30), ones, None, 0.0, closed_loop=False)
    for key, v in point(lat, 30).items():
        assert out[key] == pytest.approx(np.full(5, v), rel=1e-9), key


def test_a_resampled_mean_is_the_mean_of_the_drawn_blocks_rows():
    t, lat = rows(20, 30)
    s = BlockSample.of(t, lat, T0, T0 + 20, seed=0)
    picks = block_picks(s.k, 0, resamples=20)
    out = client_replicates(s, point(lat, 20), picks, None, 0.0, closed_loop=False)
    edges = block_edges(T0, T0 + 20)
    block = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, s.k - 1)
    c = math.sqrt(s.k / (s.k - 1))  # the plug-in variance of k blocks, scaled back to the unbiased one
    for b in range(20):  # by hand: each drawn block's rows, as often as it was drawn
        drawn = np.concatenate([lat[block == j] for j in range(s.k) for _ in range(picks[b, j])])
        assert out["mean_ms"][b] == pytest.approx(lat.mean() + c * (drawn.mean() - lat.mean()), rel=1e-9)
        assert out["qps"][b] == pytest.approx(len(lat) / 20 + c * (len(drawn) - len(lat)) / 20, rel=1e-9)


def test_the_spread_is_the_standard_error_of_iid_rows():
    t, lat = rows(60, 50, seed=5)
    s = BlockSample.of(t, lat, T0, T0 + 60, seed=0)
    out = client_replicates(s, point(lat, 60), block_picks(s.k, 0, resamples=2000), None, 0.0, closed_loop=False)
    se = lat.std(ddof=1) / math.sqrt(len(lat))
    assert np.std(out["mean_ms"]) == pytest.approx(se, rel=0.25)
    # the P99 against an iid bootstrap of the same rows (independent rows: blocks change nothing)
    rng = np.random.default_rng(9)
    iid = np.percentile(lat[rng.integers(0, len(lat), (2000, len(lat)))], 99, axis=1)
    assert np.std(out["p99_ms"]) == pytest.approx(np.std(iid), rel=0.35)


def test_a_large_step_is_subsampled_and_its_spread_scaled_back():
    t, lat = rows(40, 500, seed=2)  # 20,000 rows: 5,000 kept
    s = BlockSample.of(t, lat, T0, T0 + 40, seed=0)
    assert len(s.latencies) == 5000 and s.n_ok == len(lat)
    out = client_replicates(s, point(lat, 40), block_picks(s.k, 0, resamples=2000), None, 0.0, closed_loop=False)
    se = lat.std(ddof=1) / math.sqrt(len(lat))  # of all 20,000, not of the 5,000 kept
    assert np.std(out["mean_ms"]) == pytest.approx(se, rel=0.3)


def test_a_closed_loops_qps_follows_its_latency_by_littles_law():
    t, lat = rows(30, 40)
    users, think = 4.0, 10.0
    p = point(lat, 30)
    s = BlockSample.of(t, lat, T0, T0 + 30, seed=0)
    out = client_replicates(s, p, block_picks(s.k, 0), users, think, closed_loop=True)
    end = users / (len(lat) - users)  # the count's ends: at most one row per user at each
    little = p["qps"] * (p["mean_ms"] + think) / (out["mean_ms"] + think)
    assert np.all(np.abs(out["qps"] / little - 1) <= end + 1e-12)
    assert np.std(out["qps"] / little) > 0  # the ends' term is drawn too


def test_server_samples_resampled_with_the_same_blocks():
    blocks = [{"srv": {"cpu_pct": float(v), "target": {"queue": float(2 * v)}}} for v in range(6)]
    blocks[2]["srv"].pop("cpu_pct")  # a block without a sample of it
    picks = block_picks(6, 0, resamples=50)
    dev = server_deviations(blocks, picks)["srv"]
    c = math.sqrt(6 / 5)  # six blocks: the plug-in variance scaled back
    have = np.array([v for v in range(6) if v != 2], dtype=float)
    base = have.mean()
    for b in range(50):
        drawn = [v for j, v in enumerate(range(6)) for _ in range(picks[b, j]) if j != 2]
        expect = c * (np.mean(drawn) - base) if drawn else math.nan
        assert (dev["cpu_pct"][b] == pytest.approx(expect)) if drawn else math.isnan(dev["cpu_pct"][b])
        queue = [2 * v for j, v in enumerate(range(6)) for _ in range(picks[b, j])]
        assert dev["target.queue"][b] == pytest.approx(c * (np.mean(queue) - 5.0))


def test_a_linear_percentile_of_drawn_rows_is_numpy_s_of_the_rows_repeated():
    """linear=True (a class's step): each resample's percentile is np.percentile's default over the
    drawn blocks' rows put together, so its deviation is taken as the point figure is computed."""
    from kneeswarm.analysis.measure.resample import _weighted_linear_quantiles

    rng = np.random.default_rng(4)
    lat = np.sort(rng.lognormal(math.log(40), 0.5, 97))
    weights = rng.integers(0, 3, size=(50, len(lat)))
    weights[0] = 0
    weights[0, 5] = 1  # one row drawn once: the percentile is that row
    for q in (50.0, 95.0, 99.0):
        got = _weighted_linear_quantiles(lat, weights.astype(float), q)
        want = [np.percentile(np.repeat(lat, w), q) for w in weights]
        assert got == pytest.approx(want, rel=1e-12), q

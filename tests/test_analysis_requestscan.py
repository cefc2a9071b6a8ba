"""kneeswarm.analysis.measure.requestscan: the request parts read one at a time give the numbers numpy gives on all
rows at once, whatever the order and overlap of the parts; finished steps are freed early."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from kneeswarm.analysis.measure.validity import LITTLE_TOLERANCE, littles_law_reason
from kneeswarm.analysis.measure.requestscan import (Chunk, RequestScan, scan_frame, scan_parts, timeline_bin, TIMELINE_MAX_BINS)
from kneeswarm.contracts.rundir import RunDir

T0 = 1_700_000_000.0
STEPS = pd.DataFrame({"index": [0, 1, 2], "users": [1, 2, 4], "t_ramp": [T0, T0 + 20, T0 + 40],
                      "t_steady": [T0 + 2, T0 + 22, T0 + 42], "t_end": [T0 + 20, T0 + 40, T0 + 60]})
SETTLE = 2.0


def rows(rng: np.random.Generator, n: int = 30_000) -> pd.DataFrame:
    t = np.sort(rng.uniform(T0, T0 + 60, n))
    step = np.searchsorted(STEPS["t_ramp"].to_numpy(), t, side="right") - 1
    lat = rng.lognormal(np.log(10.0 * (step + 1)), 0.5, n)
    ok = rng.random(n) > 0.02
    err = np.where(ok, None, rng.choice(["timeout", "http_5xx"], n)).astype(object)
    return pd.DataFrame({"t_start": t, "latency_ms": lat, "ok": ok, "status": np.where(ok, 200, 503),
                         "error": err, "step": step.astype(np.int32), "users": np.array([1, 2, 4])[step],
                         "worker": rng.choice(["w1", "w2", "w3"], n), "name": "infer"})


def write_shuffled_parts(rd: RunDir, df: pd.DataFrame, rng: np.random.Generator) -> None:
    """Parts of 2 s each, 5 % of the rows arriving one or two parts late, parts written in a random order."""
    slot = np.floor((df["t_start"] - T0) / 2).astype(int) + rng.choice([0, 1, 2], len(df), p=[0.95, 0.03, 0.02])
    order = rng.permutation(sorted(slot.unique()))
    for seq, s in enumerate(order):
        part = df[slot == s]
        rd.write_request_part({c: [None if v is None or v != v else v for v in part[c].tolist()]
                               for c in part.columns}, seq)


def expected_steps(df: pd.DataFrame) -> list[dict]:
    out = []
    for r in STEPS.to_dict("records"):
        lo, hi = r["t_steady"] + SETTLE, r["t_end"]
        win = df[(df["t_start"] >= lo) & (df["t_start"] < hi)]
        lat = win.loc[win["ok"], "latency_ms"].to_numpy()
        # every row's time in flight inside the window (its latency, failed or not), over the window
        done = df["t_start"] + df["latency_ms"] / 1000
        inside = (np.minimum(done, hi) - np.maximum(df["t_start"], lo)).clip(lower=0).sum()
        out.append({"in_flight": inside / (hi - lo), "requests": len(win), "qps": len(lat) / (hi - lo), "mean_ms": lat.mean(),
                    "p50_ms": np.percentile(lat, 50), "p99_ms": np.percentile(lat, 99),
                    "p999_ms": np.percentile(lat, 99.9),
                    "errors": win.loc[~win["ok"], "error"].value_counts().sort_index().to_dict(),
                    "workers": set(win["worker"])})
    return out


def test_shuffled_overlapping_parts_give_numpy_statistics_and_timeline(tmp_path):
    rng = np.random.default_rng(3)
    df = rows(rng)
    rd = RunDir.create(tmp_path, "scan")
    write_shuffled_parts(rd, df, rng)
    scan = scan_parts(rd, STEPS, SETTLE)
    assert scan.requests == len(df) and scan.ok == int(df["ok"].sum()) and not scan.unreadable
    for got, want, workers in zip(scan.stats.to_dict("records"), expected_steps(df), scan.workers):
        assert got["requests"] == want["requests"] and got["errors"] == want["errors"]
        for k in ("qps", "mean_ms", "p50_ms", "p99_ms", "p999_ms", "in_flight"):
            assert got[k] == pytest.approx(want[k], rel=1e-9), k
        assert workers == want["workers"]
    # the timeline: per 1-s bin of completion time, by pandas on all rows at once
    done = df["t_start"] + df["latency_ms"] / 1000
    b = np.floor(done - T0).astype(int)
    p99 = df[df["ok"]].groupby(b[df["ok"]])["latency_ms"].quantile(0.99)
    tl = scan.timeline.set_index((scan.timeline["t"]).astype(int))
    assert tl["qps"].sum() == df["ok"].sum() and tl["errors_s"].sum() == (~df["ok"]).sum()
    np.testing.assert_allclose(tl.loc[p99.index, "p99_ms"].to_numpy(), p99.to_numpy(), rtol=1e-12)
    assert scan.t0 == T0  # the first ramp


def test_in_flight_is_the_users_of_a_closed_loop_whose_answers_come_in_bursts():
    # 4 users that never pause, each request served when a 500 ms period releases it (a CPU quota's
    # pattern): latencies of 1 ms to 499 ms, answers in bursts at the period edges.  Every user is
    # busy all the time, so the time-average in flight is exactly 4 on any window; X·R, from the
    # requests that started in a 2.45 s window, misses by a burst (here by more than Little's 10 %).
    rng = np.random.default_rng(7)
    t, lat = [], []
    for _ in range(4):
        now = T0
        while now < T0 + 12:
            wait = 0.5 - (now - T0) % 0.5 or 0.5  # to the next period edge
            take = rng.choice([0.001, wait])  # in this period, or at its edge
            t.append(now)
            lat.append(take * 1000.0)
            now += take
    df = pd.DataFrame({"t_start": t, "latency_ms": lat, "ok": True, "step": 0, "worker": "w1"})
    steps = pd.DataFrame({"index": [0], "users": [4], "t_ramp": [T0], "t_steady": [T0 + 1.3], "t_end": [T0 + 4.0]})
    got = scan_frame(df, steps, 0.25).stats.iloc[0]
    assert got["in_flight"] == pytest.approx(4.0, rel=1e-9)
    x_r = got["rps"] * got["mean_ms"] / 1000.0
    assert abs(x_r / 4 - 1) > LITTLE_TOLERANCE  # the estimate would have called this loop not held
    assert littles_law_reason(4, got["rps"], got["mean_ms"]) is not None
    assert littles_law_reason(4, got["rps"], got["mean_ms"], in_flight=got["in_flight"]) is None


def test_a_finished_step_is_freed_before_the_last_part():
    rng = np.random.default_rng(4)
    df = rows(rng)
    scan = RequestScan(STEPS, SETTLE, T0)
    first = df[df["t_start"] < T0 + 30]
    scan.add(Chunk.of(first))
    scan.close(T0 + 30)  # every later row starts at or after T0 + 30: step 0 (window ends at T0 + 20) is done
    assert scan.accs[0].result is not None and scan.accs[0].lat == []
    assert scan.accs[1].result is None and scan.accs[1].lat  # still open: rows may come
    scan.add(Chunk.of(df[df["t_start"] >= T0 + 30]))
    result = scan.finish()
    want = expected_steps(df)
    assert [r["requests"] for r in result.stats.to_dict("records")] == [w["requests"] for w in want]


def test_open_last_window_ends_at_the_last_completion(tmp_path):
    rng = np.random.default_rng(5)
    df = rows(rng)
    steps = STEPS.copy()
    steps.loc[2, "t_end"] = math.nan  # crashed in the last step
    rd = RunDir.create(tmp_path, "scan")
    write_shuffled_parts(rd, df, rng)
    scan = scan_parts(rd, steps, SETTLE)
    last_done = float((df["t_start"] + df["latency_ms"] / 1000).max())
    last = scan.stats.iloc[2]
    assert last["t_hi"] == pytest.approx(last_done)
    lo = steps.loc[2, "t_steady"] + SETTLE
    win = df[(df["t_start"] >= lo) & (df["t_start"] < last_done)]
    assert last["requests"] == len(win)
    assert last["p99_ms"] == pytest.approx(np.percentile(win.loc[win["ok"], "latency_ms"], 99), rel=1e-12)


def test_torn_part_is_counted_and_the_rest_analysed(tmp_path):
    rng = np.random.default_rng(6)
    df = rows(rng, 5000)
    rd = RunDir.create(tmp_path, "scan")
    write_shuffled_parts(rd, df, rng)
    victim = rd.request_parts()[3]
    n_lost = pq.ParquetFile(victim).metadata.num_rows
    victim.write_bytes(victim.read_bytes()[:100])
    scan = scan_parts(rd, STEPS, SETTLE)
    assert [u.path.name for u in scan.unreadable] == [victim.name]
    assert scan.requests == len(df) - n_lost


def test_timeline_bins_widen_only_past_the_limit():
    assert timeline_bin(3600.0) == 1.0
    assert timeline_bin(TIMELINE_MAX_BINS * 1.0) == 1.0
    assert timeline_bin(7 * 24 * 3600.0) == math.ceil(7 * 24 * 3600 / TIMELINE_MAX_BINS)

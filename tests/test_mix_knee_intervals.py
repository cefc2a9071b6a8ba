"""Each class's knees at the run's own noise (analysis/summary/classes.py), on rows built in the
test whose truth is how they were drawn: a class whose latency was drawn 1.7 x higher at 4 users
took off at 4 users, and its QPS drawn to stop rising after 2 users stopped there.

Expected intervals come from numpy on the same rows: each step's rows cut into its window's 2-s
blocks by hand (np.histogram, np.percentile over the drawn blocks' rows put together), the knee rules of the documented thresholds (P99 above 1.5 x the first step's; no later
step gaining 20 % QPS per doubling) run on each draw, and the 5th/95th percentiles of the draws'
knees.  The draws are the whole's own (``block_picks``: a class moves with the whole's step).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from kneeswarm.analysis.measure.classes import ClassRows, class_figures
from kneeswarm.analysis.measure.resample import RESAMPLES, block_picks
from kneeswarm.analysis.reports.mix_report import classes_lines, knee_line
from kneeswarm.analysis.runs.compare_classes import classes_change
from kneeswarm.analysis.summary.classes import mix_section

USERS = [1, 2, 4]
WINDOW_S = 20.0  # each step's steady window: ten 2-s blocks
K = 10
T0 = 1_800_000_000.0


def windows() -> list[tuple[float, float]]:
    return [(T0 + 30.0 * i, T0 + 30.0 * i + WINDOW_S) for i in range(len(USERS))]


def stats() -> pd.DataFrame:
    w = windows()
    return pd.DataFrame({"index": range(len(USERS)), "users": USERS, "t_lo": [a for a, _ in w],
                         "t_hi": [b for _, b in w], "valid": True})


def drawn(rng: np.random.Generator, rows_per_s: list[float], scale: list[float]) -> list[ClassRows]:
    """A class's answered rows in each step: start times uniform over the window, latencies
    lognormal around 40 ms x the step's ``scale`` (its waiting)."""
    out = []
    for (lo, hi), per_s, x in zip(windows(), rows_per_s, scale):
        n = int(per_s * WINDOW_S)
        t = np.sort(rng.uniform(lo, hi, n))
        lat = x * rng.lognormal(math.log(40.0), 0.15, n)
        out.append(ClassRows(latency_ok=lat, ok=np.ones(n, dtype=bool), ttft_ok=np.full(n, np.nan),
                             tokens_ok=np.full(n, np.nan), itl=np.empty(0), t_ok=t))
    return out


def numpy_draws(rows: list[ClassRows]) -> tuple[np.ndarray, np.ndarray]:
    """(QPS, P99) of each step on each of RESAMPLES draws: the step's figure plus √(k/(k−1)) x the
    drawn blocks' deviation from all its blocks (the documented bootstrap), by hand."""
    c = math.sqrt(K / (K - 1))
    qps = np.empty((RESAMPLES, len(rows)))
    p99 = np.empty((RESAMPLES, len(rows)))
    for i, (r, (lo, hi)) in enumerate(zip(rows, windows())):
        edges = np.linspace(lo, hi, K + 1)
        counts = np.histogram(r.t_ok, bins=edges)[0]
        block = np.digitize(r.t_ok, edges[1:-1])
        per_block = [r.latency_ok[block == j] for j in range(K)]
        base = np.percentile(r.latency_ok, 99)
        picks = block_picks(K, i, RESAMPLES)
        for b in range(RESAMPLES):
            rows_b = np.concatenate([np.tile(per_block[j], picks[b, j]) for j in range(K)])
            p99[b, i] = base + c * (np.percentile(rows_b, 99) - base)
            qps[b, i] = len(r.latency_ok) / WINDOW_S + c * (picks[b] @ counts - counts.sum()) / WINDOW_S
    return qps, p99


def took_off(p99: np.ndarray) -> float:
    """The users where P99 first exceeded 1.5 x the first step's (inf: never)."""
    above = [u for u, p in zip(USERS, p99) if p > 1.5 * p99[0]]
    return float(above[0]) if above else math.inf


def qps_knee(qps: np.ndarray) -> float:
    """The first step after which no later step gained 20 % QPS per doubling of users (inf: none)."""
    for i in range(len(USERS) - 1):
        gains = [(qps[j] / qps[i]) ** (1 / math.log2(USERS[j] / USERS[i])) - 1 for j in range(i + 1, len(USERS))]
        if all(g < 0.20 for g in gains):
            return float(USERS[i])
    return math.inf


def interval(knees: list[float]) -> list[float | None]:
    lo, hi = np.quantile(np.array(knees), [0.05, 0.95], method="inverted_cdf")
    return [float(lo), None if math.isinf(hi) else float(hi)]


def mix(by_class: dict[str, list[ClassRows]]) -> dict:
    return mix_section(class_figures(by_class, stats(), {}, {}), by_class, windows())


def test_a_class_s_knee_intervals_are_the_quantiles_of_its_resampled_rows_knees():
    rng = np.random.default_rng(5)
    # QPS 20, 40, 42 per s: stopped rising after 2 users; P99 1.7 x at 4 users: took off there
    rows = drawn(rng, [20.0, 40.0, 42.0], [1.0, 1.0, 1.7])
    got = mix({"slow": rows})["classes"][0]
    qps, p99 = numpy_draws(rows)
    took = [took_off(p99[b]) for b in range(RESAMPLES)]
    knees = [qps_knee(qps[b]) for b in range(RESAMPLES)]
    assert got["latency_knee"]["took_off_users"] == 4 and got["knee"]["users"] == 2  # the truth, measured
    assert got["latency_knee"]["took_off_interval"] == interval(took)
    assert got["knee"]["interval"] == interval(knees)
    assert got["knee"]["stability"] == pytest.approx(np.mean(np.array(knees) == 2.0), abs=1e-3)
    # the latency knee proper is the step before the took-off one
    before = [{2.0: 1.0, 4.0: 2.0}.get(t, math.inf) for t in took]
    assert got["latency_knee"]["interval"] == interval(before)
    for iv, truth in ((got["latency_knee"]["took_off_interval"], 4), (got["knee"]["interval"], 2)):
        assert iv[0] <= truth <= (iv[1] if iv[1] is not None else math.inf), iv  # covers the truth
    line = knee_line(got)
    assert "P99 took off at 4 users (" in line and "QPS stopped rising after 2 users (" in line
    assert line.count("at this run's noise") == 2, line


def _width(iv: list[float | None] | None) -> int:
    """How many of the tested outcomes (1, 2, 4 users, past the range) an interval spans."""
    outcomes = [1.0, 2.0, 4.0, math.inf]
    if iv is None:
        return 1
    hi = math.inf if iv[1] is None else iv[1]
    return sum(iv[0] <= o <= hi for o in outcomes)


def test_fewer_rows_more_noise_a_wider_interval_both_holding_the_truth():
    """The same latencies drawn (P99 1.55 x at 4 users, near the 1.5 x threshold; QPS flat, so no
    step after the first gained), at 3 and at 200 rows a second: numpy's draws say each interval,
    the fewer rows' is the wider, and both hold the truth (took off at 4; QPS knee at 1 user)."""
    got: dict[str, dict] = {}
    for name, per_s in (("few", 3.0), ("many", 200.0)):
        rows = drawn(np.random.default_rng(7), [per_s] * 3, [1.0, 1.0, 1.55])
        c = mix({name: rows})["classes"][0]
        qps, p99 = numpy_draws(rows)
        assert c["latency_knee"]["took_off_interval"] == interval([took_off(p99[b]) for b in range(RESAMPLES)])
        assert c["knee"]["interval"] == interval([qps_knee(qps[b]) for b in range(RESAMPLES)])
        got[name] = {"took": c["latency_knee"]["took_off_interval"], "knee": c["knee"]["interval"]}
    assert got["many"] == {"took": [4, 4], "knee": [1, 1]}  # 4,000 rows a step: both known
    for key, truth in (("took", 4), ("knee", 1)):
        assert _width(got["few"][key]) > _width(got["many"][key]), got
        iv = got["few"][key]
        assert iv[0] <= truth <= (math.inf if iv[1] is None else iv[1]), got


def test_first_is_claimed_only_where_the_intervals_are_apart():
    rng = np.random.default_rng(11)
    apart = mix({"slow": drawn(rng, [60.0] * 3, [1.0, 3.0, 4.0]), "cheap": drawn(rng, [60.0] * 3, [1.0, 1.0, 3.0])})
    assert apart["first_latency_knee"] == "slow" and apart["first_latency_knee_apart"] is True
    assert "the P99 of class slow took off first (at 2 users" in apart["text"]
    # slow 1.55 x at 2 users on few rows: taken off at 2 on the measured rows, but its draws reach 4 and
    # beyond; cheap took off at 4
    rng = np.random.default_rng(3)
    by = {"slow": drawn(rng, [8.0] * 3, [1.0, 1.55, 1.6]), "cheap": drawn(rng, [60.0] * 3, [1.0, 1.0, 3.0])}
    close = mix(by)
    slow, cheap = ({c["name"]: c for c in close["classes"]}[n] for n in ("slow", "cheap"))
    _q, p99_slow = numpy_draws(by["slow"])
    _q, p99_cheap = numpy_draws(by["cheap"])
    slow_iv = interval([took_off(p99_slow[b]) for b in range(RESAMPLES)])
    cheap_iv = interval([took_off(p99_cheap[b]) for b in range(RESAMPLES)])
    assert slow["latency_knee"]["took_off_users"] == 2 and cheap["latency_knee"]["took_off_users"] == 4
    overlap = (math.inf if slow_iv[1] is None else slow_iv[1]) >= cheap_iv[0]
    assert overlap  # the rows were drawn so that they overlap: the test's premise, checked on numpy's draws
    assert close["first_latency_knee"] == "slow" and close["first_latency_knee_apart"] is False
    assert "not clearly first" in close["text"] and "overlaps class cheap's" in close["text"]
    assert "took off first" not in close["text"]


def test_compare_says_whether_a_class_knee_moved_beyond_both_runs_noise():
    def summary(took: int, iv: list | None) -> dict:
        lk = {"took_off_users": took} if iv == "none" else {"took_off_users": took, "took_off_interval": iv}
        return {"mix": {"classes": [{"name": "slow", "steps": [], "latency_knee": lk,
                                     "knee": {"users": 2, "interval": [1, 2]}}]}}

    (moved,) = classes_change(summary(4, [4, 8]), summary(2, [1, 2]))
    assert moved["latency_knee_moved"] is True and moved["latency_knee_interval"] == [[4, 8], [1, 2]]
    assert moved["knee_moved"] is False  # the same interval on both sides
    line = next(x for x in classes_lines([moved]) if x.startswith("- class slow"))
    assert line.startswith("- class slow: P99 took off at 4 users (4–8 at this run's noise) (base), 2 users (1–2 at "
                           "this run's noise) (new); moved beyond both runs' noise; QPS knee 2 users"), line
    (held,) = classes_change(summary(4, [2, 8]), summary(2, [1, 2]))
    assert held["latency_knee_moved"] is False
    (open_above,) = classes_change(summary(4, [4, None]), summary(2, [1, 4]))
    assert open_above["latency_knee_moved"] is False  # [4, past the range] holds 4
    (old,) = classes_change(summary(4, "none"), summary(2, [1, 2]))
    assert old["latency_knee_moved"] is None and old["latency_knee_interval"] == [None, [1, 2]]


def test_a_soak_s_classes_have_no_knee():
    """A soak's windows hold one load: a window whose P99 is 2 x the first's is not a knee."""
    rng = np.random.default_rng(2)
    by = {"slow": drawn(rng, [20.0] * 3, [1.0, 1.0, 2.0])}
    steps = stats().assign(users=2)
    got = mix_section(class_figures(by, steps, {}, {}), by, windows(), soak=True)
    (c,) = got["classes"]
    assert c["knee"]["users"] is None and c["latency_knee"]["took_off_users"] is None
    assert "interval" not in c["knee"] and got["first_latency_knee"] is None and "no class has a knee" in got["text"]
    assert "P99 held over the steps" in knee_line(c) and "no QPS knee" in knee_line(c)

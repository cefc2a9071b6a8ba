"""The knee and every finding judged against the run's own noise (kneeswarm.analysis.summary.confidence).

A retrograde curve whose drop sits at the rule's 5 % threshold, with each step's QPS known to
about ±2 %, must come out marginal (never critical); the same curve with a drop of 30 % confirmed.
The resamples are drawn here, from a known normal noise, so the expected support is the normal's
own probability (scipy), not what the code computes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from kneeswarm.analysis.findings.load import RETROGRADE_DROP
from kneeswarm.analysis.measure.resample import Replicates
from kneeswarm.analysis.summary.confidence import CONFIRM, NOTICE, judge, knee_interval

B = 400
SIGMA = 0.02  # each step's QPS known to ±2 % (one σ)


def run(qps: dict[int, float], sigma: float = SIGMA, seed: int = 3) -> tuple[dict, Replicates]:
    rng = np.random.default_rng(seed)
    steps = [{"index": i, "users": u, "qps": q, "rps": q, "p99_ms": 50.0 * u / q * 10, "mean_ms": 40.0,
              "valid": True, "reasons": [], "window_s": 1000.0, "server": {}} for i, (u, q) in enumerate(qps.items())]
    client = [{"qps": q * (1 + sigma * rng.standard_normal(B))} for q in qps.values()]
    summary = {"steps": steps, "knee": {"users": None}, "latency_knee": {"users": None}, "hosts": {},
               "analysis": {}, "load": {"loop": "closed"}}
    from kneeswarm.analysis.findings import explain
    summary["findings"] = explain(summary)["findings"]
    return summary, Replicates(client, [{} for _ in steps], B)


def drop_support(peak: float, low: float) -> float:
    """P(drop > 5 %) when both steps' QPS carry an independent normal error of SIGMA (first order)."""
    drop = 1 - low / peak
    sd = math.hypot(SIGMA, SIGMA) * (1 - drop)
    return float(norm.sf((RETROGRADE_DROP - drop) / sd))


def ids(found: list[dict]) -> list[str]:
    return [f["id"] for f in found]


def test_a_drop_at_the_threshold_is_marginal_never_critical():
    curve = {1: 10.0, 2: 19.0, 4: 30.0, 8: 28.5}  # 5.0 % below the peak: the rule fires at the point
    summary, reps = run(curve)
    assert "retrograde" in ids(summary["findings"])
    judge(summary, {}, reps)
    assert "retrograde" not in ids(summary["findings"])
    (retro,) = [f for f in summary["findings_marginal"] if f["id"] == "retrograde"]
    assert retro["severity"] == "warning" and retro["rule_severity"] == "critical" and retro["at_point"] is True
    assert retro["support"] == pytest.approx(drop_support(30.0, 28.5), abs=0.08)  # ~0.5
    assert NOTICE < retro["support"] < CONFIRM


def test_a_drop_well_past_the_threshold_is_confirmed():
    summary, reps = run({1: 10.0, 2: 19.0, 4: 30.0, 8: 21.0})  # 30 % below
    judge(summary, {}, reps)
    (retro,) = [f for f in summary["findings"] if f["id"] == "retrograde"]
    assert retro["support"] == 1.0 and retro["severity"] == "critical"
    assert summary["findings_marginal"] == []


def test_a_drop_short_of_the_threshold_can_still_be_marginal():
    summary, reps = run({1: 10.0, 2: 19.0, 4: 30.0, 8: 28.8})  # 4 %: silent at the point
    assert "retrograde" not in ids(summary["findings"])
    judge(summary, {}, reps)
    (retro,) = [f for f in summary["findings_marginal"] if f["id"] == "retrograde"]
    assert retro["at_point"] is False
    assert retro["support"] == pytest.approx(drop_support(30.0, 28.8), abs=0.08)  # ~0.3


def test_noise_free_steps_change_nothing():
    summary, reps = run({1: 10.0, 2: 19.0, 4: 30.0, 8: 21.0}, sigma=0.0)
    before = [dict(f) for f in summary["findings"]]
    judge(summary, {}, reps)
    assert [{k: v for k, v in f.items() if k != "support"} for f in summary["findings"]] == before
    assert all(f["support"] == 1.0 for f in summary["findings"])
    assert summary["noise"]["resamples"] == B


def test_the_knee_interval_is_the_quantiles_of_the_resamples_knees():
    knees = [2.0] * 10 + [4.0] * 80 + [8.0] * 10
    interval, stability = knee_interval(4, knees)
    assert interval == [2, 8] and stability == pytest.approx(0.8)
    assert knee_interval(4, [4.0] * 97 + [8.0] * 3) == ([4, 4], pytest.approx(0.97))
    assert knee_interval(4, [4.0] * 90 + [None] * 10)[0] == [4, None]  # > 5 %: none in the tested range
    assert knee_interval(None, [None] * 99 + [4.0])[0] is None
    assert np.quantile(knees, 0.05, method="inverted_cdf") == 2.0  # the independent reading of the same


def test_a_noisy_plateau_gets_a_wide_knee_interval():
    summary, reps = run({1: 10.0, 2: 19.5, 4: 24.0, 8: 27.0, 16: 28.0}, sigma=0.05)
    from kneeswarm.analysis.models.knee import find_knee
    summary["knee"] = find_knee([1, 2, 4, 8, 16], [10.0, 19.5, 24.0, 27.0, 28.0])
    judge(summary, {}, reps)
    lo, hi = summary["knee"]["interval"]
    assert lo <= summary["knee"]["users"] <= (hi if hi is not None else math.inf)
    assert summary["knee"]["stability"] < 1.0 and (hi is None or hi > lo)


def test_a_search_bracket_narrower_than_the_noise_says_so():
    from kneeswarm.analysis.summary.search import bracket_at_noise, search_lines
    search = {"mode": "closed", "knee_bracket": [12, 13], "probes": []}
    bracket_at_noise(search, {"users": 12, "interval": [8, 12]})
    assert search["bracket_holds"] is False and search["knee_at_noise"] == [8, 12]
    assert any("narrower than this run's noise" in line and "between 8 and 12" in line
               for line in search_lines({"search": search}))
    bracket_at_noise(search, {"users": 12, "interval": [12, 13]})
    assert search["bracket_holds"] is True
    assert not any("narrower" in line for line in search_lines({"search": search}))
    bracket_at_noise(search, {"users": 12, "interval": [12, None]})  # some resamples: no knee in range
    assert search["bracket_holds"] is False


def test_each_step_carries_its_own_95_percent_interval():
    summary, reps = run({1: 10.0, 2: 19.0, 4: 30.0, 8: 21.0})
    summary["steps"][2]["server"] = {"srv": {"cpu_pct": 80.0, "target": {"queue": 3.0}}}
    reps.server[2] = {"srv": {"cpu_pct": np.linspace(-5, 5, B), "target.queue": np.zeros(B)}}
    judge(summary, {}, reps)
    lo, hi = summary["steps"][2]["ci"]["qps"]
    expect = np.percentile(reps.client[2]["qps"], [2.5, 97.5])  # numpy on the same draws
    assert (lo, hi) == pytest.approx(tuple(expect)) and lo < 30.0 < hi
    assert summary["steps"][2]["server_ci"]["srv"]["cpu_pct"] == pytest.approx([75.25, 84.75], abs=0.03)
    assert summary["steps"][2]["server_ci"]["srv"]["target.queue"] == [3.0, 3.0]
